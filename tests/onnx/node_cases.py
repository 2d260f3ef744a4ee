"""The ONNX node test cases (``onnx.backend.test``) as the corpus tests use them: the cases with
a float32 input and the error bars (their feeds and the load check: ``graphamp.models.onnx_cases``,
which the benchmarks share)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
from onnx.backend.test.case.node import collect_testcases

RANDOM_OPS = {"Dropout", "RandomNormal", "RandomNormalLike", "RandomUniform",
              "RandomUniformLike", "Bernoulli", "Multinomial"}  # fmt: skip
TOLERANCE = {"float16": 2e-2, "bfloat16": 8e-2}


def float_cases() -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    return [
        case
        for case in cases
        if any(
            i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for i in case.model.graph.input
        )
        and not {n.op_type for n in case.model.graph.node} & RANDOM_OPS
    ]


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    finite = np.isfinite(want64)
    assert (np.isfinite(got64) == finite).all(), "NaN/Inf where the original has none"
    if not finite.any():
        return 0.0
    scale = np.abs(want64[finite]).max()
    error = np.abs(got64[finite] - want64[finite]).max()
    return float(error / scale) if scale else float(error)
