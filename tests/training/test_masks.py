"""graphamp.fx.training.masks: dropout masks held as booleans compute the traced values bit
for bit, and a compiled step draws them with ``rand`` and holds them as booleans."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from graphamp.fx.training import masks, partition


def dropout_step(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A forward with two dropouts and its gradient: each mask is read by the forward's
    product and by the backward's."""

    def loss(weight: torch.Tensor) -> torch.Tensor:
        hidden = torch.nn.functional.dropout(x * weight, 0.25, training=True)
        return (torch.nn.functional.dropout(hidden, 0.1, training=True) ** 2).sum()

    value = loss(w)
    return torch.func.grad(loss)(w), value


def traced(fn, *examples: torch.Tensor) -> torch.fx.GraphModule:  # type: ignore[no-untyped-def]
    """``fn`` traced as a step is: functional ops only (dropout's ``bernoulli.p``)."""
    return make_fx(torch.func.functionalize(fn, remove="mutations"))(*examples)


def ops(module: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in module.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_boolean_masks_compute_the_traced_values_and_draw_the_same_numbers(dtype):
    x = torch.randn(64, 33).to(dtype)
    x[0, :4] = torch.tensor([-1.0, float("inf"), float("-inf"), float("nan")]).to(dtype)
    w = torch.randn(64, 33).to(dtype)
    module = traced(dropout_step, x, w)
    torch.manual_seed(5)
    want = module(x, w)
    after_want = torch.rand(3)
    assert masks.as_bool(module) == 4  # two dropouts, in the value's forward and in grad's
    bools = [n for n in module.graph.nodes if n.target is torch.ops.aten.bernoulli.p]
    assert all(n.meta["val"].dtype == torch.bool for n in bools) and bools
    assert "aten.div.Scalar" not in ops(module)
    torch.manual_seed(5)
    have = module(x, w)
    assert torch.equal(torch.rand(3), after_want)  # the generator left where it was
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    for a, b in zip(want, have, strict=True):
        assert torch.equal(a.view(bits), b.view(bits))  # -0.0 and NaN included


def test_a_compiled_step_draws_the_boolean_masks_with_rand_and_holds_them_as_they_are():
    x, w = torch.randn(64, 33), torch.randn(64, 33)
    module = traced(dropout_step, x, w)
    masks.as_bool(module)
    assert partition.random_masks(module) == 4
    compared = [n for n in module.graph.nodes if n.target is torch.ops.aten.lt.Scalar]
    assert len(compared) == 4 and all(n.meta["val"].dtype == torch.bool for n in compared)
    # each boolean mask read as it is (one byte an element held), not copied into a type
    assert "aten._to_copy.default" not in ops(module)
    assert all(u.target is torch.ops.aten.mul.Tensor for n in compared for u in n.users)
    torch.manual_seed(0)
    grad, value = module(x, w)
    kept = (grad != 0).float().mean()  # kept by both masks: 0.75 * 0.9 of the elements
    assert 0.6 < float(kept) < 0.75 and torch.isfinite(value).all()


def scaled_mask(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.div.Scalar(torch.bernoulli(torch.empty_like(x), 0.9), 0.9)


def test_a_mask_read_other_than_by_a_product_of_its_type_is_left_as_traced():
    def plain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return y * scaled_mask(x)

    def summed(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = scaled_mask(x)
        return x * mask, mask + y  # a sum reads the scaled mask: its values are needed

    def promoted(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return y * scaled_mask(x)  # y is bfloat16: the product is float32, the mask's type

    x = torch.randn(4, 8)
    assert masks.as_bool(traced(plain, x, x)) == 1
    assert masks.as_bool(traced(summed, x, x)) == 0
    assert masks.as_bool(traced(promoted, x, x.bfloat16())) == 0


def fused_dropout_step(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """As :func:`dropout_step` with dropout as a GPU traces it: ``native_dropout``, whose
    traced backward widens, scales and multiplies the mask."""

    def loss(weight: torch.Tensor) -> torch.Tensor:
        hidden = torch.native_dropout(x * weight, 0.25, True)[0]
        return (torch.native_dropout(hidden, 0.1, True)[0] ** 2).sum()

    value = loss(w)
    return torch.func.grad(loss)(w), value


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_dropout_backward_runs_as_one_kernel_with_the_traced_values(dtype):
    x = torch.randn(64, 33).to(dtype)
    x[0, :4] = torch.tensor([-1.0, float("inf"), float("-inf"), float("nan")]).to(dtype)
    x[1, :2] = torch.tensor([0.0, -0.0]).to(dtype)
    w = torch.randn(64, 33).to(dtype)
    module = traced(fused_dropout_step, x, w)
    assert "aten.native_dropout_backward.default" not in ops(module)
    scalings = ops(module).count("aten.mul.Scalar")
    torch.manual_seed(5)
    want = module(x, w)
    assert masks.fused_backward(module) == 2  # one product per dropout's backward
    assert ops(module).count("aten.native_dropout_backward.default") == 2
    casts = [n for n in module.graph.nodes if n.target is torch.ops.aten._to_copy.default]
    assert not [n for n in casts if n.args[0].meta["val"].dtype == torch.bool]  # none widened
    assert ops(module).count("aten.mul.Scalar") == scalings - 2  # nor scaled
    torch.manual_seed(5)
    have = module(x, w)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    for a, b in zip(want, have, strict=True):
        assert torch.equal(a.view(bits), b.view(bits))  # -0.0 and NaN included


def test_a_widened_mask_read_by_a_broadcasting_product_is_left_as_traced():
    def step(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x * (mask.to(x.dtype) * 2.0)  # x is wider than the mask: not a dropout's

    module = traced(step, torch.randn(4, 8), torch.rand(8) < 0.5)
    before = ops(module)
    assert masks.fused_backward(module) == 0
    assert ops(module) == before
