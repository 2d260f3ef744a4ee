"""graphamp.fx.training.bindings: aten nodes called through PyTorch's Python bindings only where the
binding dispatches the node's own op, with the values unchanged."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn
from torch.fx.experimental.proxy_tensor import make_fx

from graphamp.fx import train_step
from graphamp.fx.training import bindings


def overloads(module: fx.GraphModule) -> list[str]:
    """The nodes still calling an aten overload, by op."""
    return [
        str(node.target)
        for node in module.graph.nodes
        if isinstance(node.target, torch._ops.OpOverload)
    ]


def test_ops_with_a_binding_call_it_and_compute_the_same_values():
    def step(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.mm(x, w.t()).view(2, 6)
        half = y.to(torch.bfloat16)  # _to_copy: no binding of that name
        return y.sum(dim=1), torch.nn.functional.gelu(y), half

    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 5, generator=generator), torch.randn(3, 5, generator=generator)
    module = make_fx(step)(x, w)
    before = overloads(module)
    expected = module(x, w)
    made = bindings.with_bindings(module)
    assert made == len(before) - 1 and overloads(module) == ["aten._to_copy.default"]
    for want, have in zip(expected, module(x, w), strict=True):
        assert torch.equal(want, have) and want.dtype == have.dtype
    bindings.without_bindings(module)
    assert overloads(module) == before


def test_a_binding_that_dispatches_other_arguments_is_not_used():
    """torch._C._nn.mse_loss has another default reduction than aten.mse_loss (it reduces
    nothing): a node calling aten.mse_loss with the default keeps it, as does a node whose
    input has no known shape; one naming its reduction calls the binding."""
    graph = fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    x.meta["val"] = y.meta["val"] = torch.empty(2, 6)
    unknown = graph.placeholder("unknown")
    mse_loss = torch.ops.aten.mse_loss.default
    default = graph.call_function(mse_loss, (x, y))
    named = graph.call_function(mse_loss, (x, y, 2))  # Reduction::Sum
    negated = graph.call_function(torch.ops.aten.neg.default, (unknown,))
    graph.output((default, named, negated))
    module = fx.GraphModule(nn.Module(), graph)
    a, b = torch.randn(2, 6), torch.randn(2, 6)
    expected = module(a, b, a)
    assert bindings.with_bindings(module) == 1
    assert overloads(module) == ["aten.mse_loss.default", "aten.neg.default"]
    for want, have in zip(expected, module(a, b, a), strict=True):
        assert torch.equal(want, have)


@pytest.mark.slow
def test_a_training_step_calls_bindings_and_trains_as_with_overloads():
    """A step on a small MLP: most nodes call bindings, and three steps give the parameters
    a step calling every overload gives, bit for bit; compile's form calls overloads."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3))
    twin = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3))
    twin.load_state_dict(model.state_dict())
    sgd = torch.optim.SGD
    step = train_step(model, nn.functional.mse_loss, sgd(model.parameters(), lr=0.1, momentum=0.9))
    plain = train_step(twin, nn.functional.mse_loss, sgd(twin.parameters(), lr=0.1, momentum=0.9))
    x, y = torch.randn(5, 6), torch.randn(5, 3)
    step(x, y)
    plain(x, y)
    calls = overloads(step.graph)  # type: ignore[arg-type]
    bindings.without_bindings(plain.graph)  # type: ignore[arg-type]
    assert len(calls) < len(overloads(plain.graph)) / 2, calls  # type: ignore[arg-type]
    for _ in range(2):
        step(x, y)
        plain(x, y)
    for name, value in step.params.items():
        assert torch.equal(value, plain.params[name]), name
