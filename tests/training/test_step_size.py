"""Adam's last formula in an eager CPU step: the three traced operations as the one
``addcdiv`` torch.optim calls, the same bits (graphamp/fx/training/step_size.py). The whole
step against torch.optim bit for bit: test_training's
``test_train_step_on_low_precision_parameters_steps_as_torch_optim[*-torch.float32]``."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn
from torch.fx.experimental.proxy_tensor import make_fx

from graphamp.fx import train_step
from graphamp.fx.training import step_size
from tests.training.twins import assert_same_state_and_compile_form

aten = torch.ops.aten


def descent(param: torch.Tensor, exp_avg: torch.Tensor, denom: torch.Tensor, size: torch.Tensor):
    """What graphamp.fx.training.optim writes for ``param.addcdiv(exp_avg, denom, value=-size)``."""
    return param - (size * exp_avg) / denom


def operands(dtype: torch.dtype = torch.float32, n: int = 1003) -> list[torch.Tensor]:
    """A parameter, a first moment of both signs, a positive denominator (a length no vector
    width divides: the kernels' scalar tails compute some of it), and a float64 step size."""
    generator = torch.Generator().manual_seed(0)
    param = torch.randn(n, generator=generator).to(dtype)
    exp_avg = (torch.randn(n, generator=generator) * 1e-2).to(dtype)
    denom = (torch.rand(n, generator=generator) * 1e-2 + 1e-8).to(dtype)
    return [param, exp_avg, denom, torch.tensor(1e-3 / (1 - 0.9**7), dtype=torch.float64)]


def targets(module: fx.GraphModule) -> list[object]:
    return [n.target for n in module.graph.nodes if n.op == "call_function"]


def test_the_three_operations_become_one_addcdiv_with_the_same_bits():
    args = operands()
    traced = make_fx(descent)(*args)
    expected = traced(*args)
    assert step_size.with_addcdiv(traced) == 1
    assert aten.addcdiv.default in targets(traced)
    assert aten.sub.Tensor not in targets(traced) and aten.div.Tensor not in targets(traced)
    got = traced(*args)
    param, exp_avg, denom, size = args
    torch_optim = param.addcdiv(exp_avg, denom, value=-float(size))
    bits = (expected.view(torch.int32), got.view(torch.int32), torch_optim.view(torch.int32))
    assert torch.equal(bits[0], bits[1]) and torch.equal(bits[1], bits[2])
    assert not torch.equal(got, param)  # the step moved the parameter
    # torch.compile's form: the traced operations again, nothing read on the host
    assert step_size.without_addcdiv(traced) == 1
    assert targets(traced) == [aten.mul.Tensor, aten.div.Tensor, aten.sub.Tensor]
    assert torch.equal(traced(*args), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_low_precision_parameter_keeps_its_widened_formula(dtype):
    """The traced formula of a bfloat16/float16 parameter is written on its widened values,
    the one here on the parameter's own type: neither is what ``addcdiv`` computes."""
    traced = make_fx(descent)(*operands(dtype))
    assert step_size.with_addcdiv(traced) == 0


def test_a_product_read_elsewhere_is_not_rewritten():
    def twice(param, exp_avg, denom, size):  # type: ignore[no-untyped-def]
        product = size * exp_avg
        return param - product / denom, product

    traced = make_fx(twice)(*operands())
    assert step_size.with_addcdiv(traced) == 0


def test_an_adamw_step_calls_addcdiv_and_hands_torch_compile_the_traced_form(monkeypatch):
    """An eager AdamW step (float32 parameters, bfloat16 compute) ends its update with
    ``_foreach_addcdiv_`` and trains as the step without the rewrite bit for bit; its form for
    torch.compile is that step's, node for node."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    twin = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    twin.load_state_dict(model.state_dict())

    def adamw(module: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(module.parameters(), lr=1e-2, weight_decay=1e-2)

    step = train_step(model, nn.functional.mse_loss, adamw(model), dtype="bfloat16")
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    step(x, y)
    assert any("_foreach_addcdiv_" in str(n.args) for n in step.graph.graph.nodes)  # type: ignore[union-attr]

    monkeypatch.setattr(step_size, "with_addcdiv", lambda module: 0)
    traced = train_step(twin, nn.functional.mse_loss, adamw(twin), dtype="bfloat16")
    traced(x, y)
    assert not any("_foreach_addcdiv_" in str(n.args) for n in traced.graph.graph.nodes)  # type: ignore[union-attr]
    for _ in range(3):
        step(x, y)
        traced(x, y)
    assert_same_state_and_compile_form(step, traced)
