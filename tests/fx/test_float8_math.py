"""The float8 arithmetic in aten ops (graphamp.fx.dialect.float8) against independent references:
the quantiser against ml_dtypes on every bfloat16 and float16 value, the delayed-scaling
update against a plain-loop transcription of Transformer Engine's ``delayed_scaling.cu``."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from graphamp.fx.dialect import float8

ML_DTYPES = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def every_value(dtype: torch.dtype) -> torch.Tensor:
    """All 65,536 bit patterns of a 16-bit float type (inf and NaN included)."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)


@pytest.mark.parametrize("source", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_quantiser_equals_ml_dtypes_after_clipping_on_every_value(source, fmt):
    values = every_value(source)
    one = torch.ones((), dtype=torch.float32)
    quantised = float8.quantize(values, one, fmt)
    assert quantised.dtype == float8.FORMATS[fmt]
    limit = float8.fp8_max(fmt)
    wide = values.float().numpy()
    expected = np.clip(wide, -limit, limit).astype(ML_DTYPES[fmt])  # NaN stays NaN
    got = quantised.view(torch.uint8).numpy().view(ML_DTYPES[fmt])
    same = (got.astype(np.float32) == expected.astype(np.float32)) | (
        np.isnan(got.astype(np.float32)) & np.isnan(expected.astype(np.float32))
    )
    assert same.all(), wide[~same][:5]
    # What clipping decides: every value beyond the range saturates (inf too), never inf.
    beyond = np.abs(wide) > limit
    assert beyond.any() and np.isfinite(got[beyond].astype(np.float32)).all()


def test_e5m2_is_clamped_where_torch_would_round_to_inf():
    """torch 2.13 saturates E4M3 but not E5M2 (61440 rounds to inf): the quantiser's clamp
    makes E5M2 saturate too, as ONNX's Cast(saturate=1) does."""
    big = torch.tensor([61440.0, 1e6, -float("inf")])
    assert torch.isinf(big.to(torch.float8_e5m2).float()).all()  # what torch alone does
    got = float8.quantize(big, torch.ones(()), "e5m2").float()
    assert got.tolist() == [57344.0, 57344.0, -57344.0]


def test_scale_is_torchao_amax_to_scale():
    from torchao.float8.float8_utils import amax_to_scale

    amaxes = torch.tensor([0.0, 1e-30, 3.1, 448.0, 1e5, 3.3e38], dtype=torch.float32)
    for fmt, dtype in (("e4m3fn", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        for power_of_2 in (False, True):
            for amax in amaxes:
                ours = float8.scale_of(amax, fmt, power_of_2)
                theirs = amax_to_scale(amax, dtype, round_scales_to_power_of_2=power_of_2)
                assert torch.equal(ours, theirs), (fmt, power_of_2, float(amax))


# --- delayed scaling: Transformer Engine's delayed_scaling.cu as a plain loop ------------------


def te_amax_and_scale_update(
    history: list[float], scale: float, fp8_max: float, algorithm: str, margin: float
) -> tuple[list[float], float]:
    """transformer_engine/common/recipe/delayed_scaling.cu, ``amax_and_scale_update_impl::
    kernel`` for one scale, transcribed element by element in float32."""
    f32 = np.float32
    length = len(history)
    last_amax = f32(history[0])
    amax = f32(0.0)
    updated = [f32(0.0)] * length
    for i in range(length):
        a = f32(history[i + 1]) if i < length - 1 else last_amax
        amax = np.fmax(amax, a)  # fmaxf: a NaN operand loses to the other
        updated[i] = a if i > 0 else f32(0.0)
    if algorithm == "most_recent":
        amax = last_amax
    scaled_max = f32(fp8_max) * np.power(f32(2.0), f32(-margin), dtype=f32)
    new_scale = f32(scaled_max / amax) if math.isfinite(amax) and amax > 0 else f32(scale)
    return [float(v) for v in updated], float(new_scale)


HISTORIES = [
    [3.5],
    [0.0],
    [float("inf")],
    [1e-3, 7.25],
    [0.0, 0.0],
    [2.0, float("nan"), 5.0],
    [float("nan"), float("nan")],
    [
        0.5,
        1e-40,
        3e3,
        float("inf"),
        0.0,
        12.0,
        1e-7,
        448.0,
        0.25,
        2.5e-3,
        9.0,
        1.0,
        6.0,
        2.0,
        0.0,
        77.0,
    ],
]


@pytest.mark.parametrize("history", HISTORIES, ids=lambda h: f"L{len(h)}")
@pytest.mark.parametrize("algorithm", ["max", "most_recent"])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("margin", [0, 2])
def test_delayed_update_is_transformer_engines_kernel(history, algorithm, fmt, margin):
    old_scale = 0.37  # kept where the amax is 0, inf or NaN
    fp8_max = float8.fp8_max(fmt)
    expected_history, expected_scale = te_amax_and_scale_update(
        history, old_scale, fp8_max, algorithm, margin
    )
    new_history, new_scale = float8.delayed_update(
        torch.tensor(history, dtype=torch.float32),
        torch.tensor(old_scale, dtype=torch.float32),
        fmt,
        algorithm,
        margin,
    )
    assert new_history.dtype == new_scale.dtype == torch.float32
    assert np.array_equal(new_history.numpy(), np.float32(expected_history), equal_nan=True)
    assert new_scale.item() == np.float32(expected_scale)
