"""graphamp.fx.training.eager.without_unread: an eager step runs no op whose value nothing
reads, and keeps every op that does something else (writes, draws, asserts)."""

from __future__ import annotations

import torch
from torch import fx

from graphamp.fx.training.eager import without_unread

aten = torch.ops.aten


def test_unread_pure_ops_go_and_writes_draws_and_assertions_stay():
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(4, 4)
    cast = graph.call_function(aten._to_copy.default, (x,), {"dtype": torch.bfloat16})
    graph.call_function(aten.view.default, (cast, [16]))  # unread, and so then is the cast
    graph.call_function(aten.bernoulli.p, (x, 0.5))  # a draw: the generator moves
    written = graph.call_function(aten.add.Tensor, (x, 1.0))
    graph.call_function(aten.mul_.Tensor, (written, 2.0))  # writes in place
    positive = graph.call_function(aten.gt.Scalar, (x, -10.0))
    every = graph.call_function(aten.all.default, (positive,))
    item = graph.call_function(aten._local_scalar_dense.default, (every,))
    graph.call_function(aten._assert_scalar.default, (item, "x > -10"))  # returns nothing
    graph.output(graph.call_function(aten.sin.default, (x,)))
    module = fx.GraphModule(torch.nn.Module(), graph)
    assert without_unread(module) == 2
    kept = [str(n.target) for n in module.graph.nodes if n.op == "call_function"]
    assert "aten._to_copy.default" not in kept and "aten.view.default" not in kept
    for op in ("bernoulli.p", "mul_.Tensor", "add.Tensor", "_assert_scalar.default", "sin"):
        assert any(op in target for target in kept), op
    value = torch.randn(4, 4)
    torch.testing.assert_close(module(value), value.sin())
