"""graphamp.fx.convert(..., calibrate=batches): the range rule for PyTorch modules."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import graphamp.fx
from graphamp.core.vocab import Precision, Rule
from graphamp.errors import GraphampError
from graphamp.fx.dialect.calibration import calibrate
from graphamp.fx.dialect.capture import capture


class Overflowing(torch.nn.Module):
    """hidden (|h| ~ 2e5: inf in float16) -> relu -> down, plus a healthy side branch."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.hidden = torch.nn.Linear(16, 16)
        self.down = torch.nn.Linear(16, 8)
        self.side = torch.nn.Linear(16, 8)
        with torch.no_grad():
            self.hidden.weight.mul_(1e5)
            self.down.weight.mul_(1e-4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.hidden(x))) + self.side(x)


def batches(count: int = 3) -> list[tuple[torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 16, generator=generator),) for _ in range(count)]


def convert(model, **keywords):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no float16 matrix units on this CPU: slow, still right
        return graphamp.fx.convert(model, batches(1)[0], device="cuda", dtype="float16", **keywords)


def test_calibrated_fx_conversion_keeps_the_overflow_float32_and_the_output_finite():
    model = Overflowing().eval()
    plain, _ = convert(model)
    fixed, plan = convert(model, calibrate=batches())
    kept = {name for name, d in plan.nodes.items() if d.rule is Rule.RANGE}
    assert kept == {"hidden/linear", "relu", "down/linear"}
    assert "'hidden/linear' reaches |x| = " in plan.nodes["hidden/linear"].reason
    assert plan.nodes["side/linear"].precision == Precision.FLOAT16
    x = batches(4)[3][0]  # data the calibration did not see
    with torch.no_grad():
        want = model(x)
        assert not torch.isfinite(plain(x)).all()  # real float16 arithmetic overflows
        got = fixed(x).float()
    assert torch.isfinite(got).all()
    assert float((got - want).abs().max() / want.abs().max()) < 1e-2


def test_fx_calibrate_takes_tuples_tensors_and_dicts_by_input_name():
    module = capture(Overflowing(), batches(1)[0])
    data = batches(2)
    by_tuple = calibrate(module, data)
    by_tensor = calibrate(module, [b[0] for b in data])
    by_name = calibrate(module, [{"x": b[0].numpy()} for b in data])
    assert by_tuple.batches == 2
    assert by_tuple.tensors == by_tensor.tensors == by_name.tensors
    assert by_tuple.tensors["x"].max_abs == pytest.approx(
        float(np.abs(np.concatenate([b[0].numpy() for b in data])).max())
    )
    with pytest.raises(GraphampError, match="batch 0 has no value for input 'x'"):
        calibrate(module, [{"y": data[0][0]}])
    with pytest.raises(GraphampError, match="batch 0 holds 2 values, the module takes 1"):
        calibrate(module, [(data[0][0], data[0][0])])
