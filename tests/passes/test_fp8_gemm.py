"""The validator of what CUDA's float8 GEMMs accept, on CPU: each rule refuses what PyTorch's
CUDA checks refuse, and accepts what they accept."""

from __future__ import annotations

import dataclasses

import pytest

from graphamp.passes.fp8_gemm import ScaledGemm, problems

ACCEPTED = ScaledGemm("e4m3fn", "e4m3fn", 8192, 4096, 14336)


def test_what_cuda_accepts_has_no_problems():
    assert problems(ACCEPTED) == []
    # HYBRID's gradient products mix the formats; rowwise scales on both sides; odd M
    assert problems(dataclasses.replace(ACCEPTED, a_format="e5m2")) == []
    assert problems(dataclasses.replace(ACCEPTED, b_format="e5m2", m=7)) == []
    assert problems(dataclasses.replace(ACCEPTED, a_granularity="row", b_granularity="row")) == []
    assert problems(dataclasses.replace(ACCEPTED, bias=True, out_dtype="bfloat16")) == []


@pytest.mark.parametrize(
    ("change", "found"),
    [
        ({"a_format": "e5m2", "b_format": "e5m2"}, "both operands are e5m2"),
        ({"a_format": "float16"}, "operand A is float16, not a float8 format"),
        ({"b_layout": "row"}, "needs row-major A and column-major B (TN)"),
        ({"a_layout": "column"}, "needs row-major A and column-major B (TN)"),
        ({"k": 4100}, "K = 4100 is not a multiple of 16"),
        ({"n": 14330}, "N = 14330 is not a multiple of 16"),
        ({"k": None}, "K is unknown"),
        ({"bias": True, "out_dtype": "float32"}, "a bias with a float32 output"),
        ({"scale_dtype": "bfloat16"}, "scales are bfloat16: CUDA takes float32 scales"),
        ({"a_granularity": "row"}, "per row (A) and per tensor (B)"),
        ({"a_granularity": "block", "b_granularity": "block"}, "per block (A)"),
        ({"rank": 3}, "flatten the batch dimensions into M"),
        ({"out_dtype": "int8"}, "output type int8 is not one CUDA writes"),
    ],
)
def test_each_refusal_is_named(change, found):
    listed = problems(dataclasses.replace(ACCEPTED, **change))
    assert len(listed) == 1 and found in listed[0], listed
