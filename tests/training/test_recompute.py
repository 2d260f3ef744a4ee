"""graphamp.fx.training.recompute: which forward values an eager step computes again in its
backward, that nothing is held longer for it, and that the values stay the traced ones."""

from __future__ import annotations

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from graphamp.fx.training import recompute


def traced(fn, *examples: torch.Tensor) -> fx.GraphModule:  # type: ignore[no-untyped-def]
    return make_fx(torch.func.functionalize(fn, remove="mutations"))(*examples)


def recomputed(module: fx.GraphModule) -> dict[str, str]:
    """Each copy saved_less made: its op, by the forward node it copies."""
    return {
        n.meta["graphamp_recomputed"]: str(n.target)
        for n in module.graph.nodes
        if "graphamp_recomputed" in n.meta
    }


def attention_like(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """probabilities * mask (held by nothing but the product's readers), then a matrix
    product whose backward reads that product; the loss first, as a step graph's output 0."""

    def loss(weight: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probabilities = torch.softmax(x @ weight, dim=-1)
        dropped = probabilities * (x > 0).to(x.dtype)  # the mask: read by the backward too
        value = (dropped @ values).square().sum()
        return value, value.detach()

    grads, value = torch.func.grad(loss, argnums=(0, 1), has_aux=True)(w, v)
    return value, *grads


def test_a_product_of_held_values_is_computed_again_where_the_backward_reads_it():
    x, w, v = torch.randn(6, 8), torch.randn(8, 8), torch.randn(8, 5)
    module = traced(attention_like, x, w, v)
    want = module(x, w, v)
    assert recompute.saved_less(module) >= 1
    copies = recomputed(module)
    assert "aten.mul.Tensor" in copies.values(), copies
    order = {node: index for index, node in enumerate(module.graph.nodes)}
    by_name = {node.name: node for node in module.graph.nodes}
    loss = module.graph.output_node().args[0][0]
    for node in module.graph.nodes:
        name = node.meta.get("graphamp_recomputed")
        if name is not None:
            original = by_name[name]
            assert order[node] > order[loss]  # in the backward
            assert all(order[u] <= order[loss] for u in original.users)  # forward reads only
    have = module(x, w, v)
    for a, b in zip(want, have, strict=True):
        assert torch.equal(a, b)


def test_nothing_is_held_longer_and_a_weights_cast_is_held():
    def step(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        def loss(weight: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            q = (x @ weight.to(torch.bfloat16)).float()  # the cast: of the arguments alone
            doubled = q * 2.0  # read by the backward; q's last backward read comes before
            value = (doubled @ values).sum() + q.sin().sum()
            return value, value.detach()

        grads, value = torch.func.grad(loss, argnums=(0, 1), has_aux=True)(w, v)
        return value, *grads

    x, w, v = torch.randn(4, 6).bfloat16(), torch.randn(6, 6), torch.randn(6, 3)
    module = traced(step, x, w, v)
    want = module(x, w, v)
    order = {node: index for index, node in enumerate(module.graph.nodes)}
    loss = module.graph.output_node().args[0][0]
    doubled = next(n for n in module.graph.nodes if n.target is torch.ops.aten.mul.Tensor)
    q = doubled.args[0]
    assert max(order[u] for u in q.users) < min(
        order[u] for u in doubled.users if order[u] > order[loss]
    )  # the case the test is about: q is read last before the backward reads doubled
    recompute.saved_less(module)
    assert recomputed(module) == {}  # neither doubled (q would be held longer) nor the cast
    for a, b in zip(want, module(x, w, v), strict=True):
        assert torch.equal(a, b)


def widened_step(x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A bfloat16 product widened to float32 for a float32 one (the float32 copy read by the
    backward, the bfloat16 one not), then a product with a weight's cast that the backward
    reads (the gradient of its other operand)."""

    def loss(w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = x @ w1.to(torch.bfloat16)
        wide = h.float() * 0.5
        z = (wide @ w2).to(torch.bfloat16) @ w3.to(torch.bfloat16)
        value = z.float().sum()
        return value, value.detach()

    grads, value = torch.func.grad(loss, argnums=(0, 1, 2), has_aux=True)(*weights)
    return value, *grads


def test_with_casts_a_weights_cast_and_a_widened_value_are_computed_again():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=generator).bfloat16()
    weights = [torch.randn(6, 6, generator=generator) for _ in range(3)]
    module = traced(widened_step, x, *weights)
    want = module(x, *weights)
    recompute.saved_less(module)
    assert recomputed(module) == {}  # as autograd holds them: the cast and the float32 copy
    module = traced(widened_step, x, *weights)
    h = next(n for n in module.graph.nodes if n.target is torch.ops.aten.mm.default)
    loss = module.graph.output_node().args[0][0]
    order = {node: index for index, node in enumerate(module.graph.nodes)}
    assert all(order[u] < order[loss] for u in h.users)  # h: read by the forward alone
    assert recompute.saved_less(module, casts=True) == 2
    copies = set(recomputed(module).values())
    assert copies == {"aten.mul.Tensor", "aten._to_copy.default"}, copies  # wide, w3's cast
    order = {node: index for index, node in enumerate(module.graph.nodes)}
    assert any(order[u] > order[loss] for u in h.users)  # held in wide's place: half its bytes
    for a, b in zip(want, module(x, *weights), strict=True):
        assert torch.equal(a, b)


def test_copies_for_casts_are_held_again_for_compile_unless_asked_for_there_too():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=generator).bfloat16()
    weights = [torch.randn(6, 6, generator=generator) for _ in range(3)]
    want = traced(widened_step, x, *weights)(x, *weights)
    for compiled_too in (False, True):
        module = traced(widened_step, x, *weights)
        before = module.code
        assert recompute.saved_less(module, casts=True, compiled_too=compiled_too) == 2
        undone = recompute.held_again(module)
        if compiled_too:  # asked for everywhere: the compiled form keeps the copies
            assert undone == 0 and set(recomputed(module).values()) == {
                "aten.mul.Tensor",
                "aten._to_copy.default",
            }
        else:  # the graph as traced again
            # three copies: the widening cast and the product of wide, the cast of w3
            assert undone == 3 and recomputed(module) == {} and module.code == before
        for a, b in zip(want, module(x, *weights), strict=True):
            assert torch.equal(a, b)
