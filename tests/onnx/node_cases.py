"""The ONNX node test cases (``onnx.backend.test``) as the corpus tests use them: the cases with
a float32 input, each case's inputs as its model declares them, and the error bars."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases

from graphamp.core import dtypes

RANDOM_OPS = {"Dropout", "RandomNormal", "RandomNormalLike", "RandomUniform",
              "RandomUniformLike", "Bernoulli", "Multinomial"}  # fmt: skip
TOLERANCE = {"float16": 2e-2, "bfloat16": 8e-2}


def float_cases() -> list:  # type: ignore[type-arg]
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


def feeds_for(proto: onnx.ModelProto, inputs: list) -> dict[str, object]:  # type: ignore[type-arg]
    """The case's inputs in each input's declared type (sequences and optionals as given)."""
    feeds: dict[str, object] = {}
    for info, value in zip(proto.graph.input, inputs, strict=False):
        if info.type.HasField("tensor_type"):
            name = dtypes.from_onnx(info.type.tensor_type.elem_type)
            if isinstance(value, onnx.TensorProto):
                value = numpy_helper.to_array(value)
            array = np.asarray(value)
            if name in dtypes.FLOAT_TYPES and array.dtype.kind == "f":
                array = array.astype(dtypes.numpy_type(name))
            value = array
        feeds[info.name] = value
    return feeds


def loads(proto: onnx.ModelProto) -> bool:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except ort.capi.onnxruntime_pybind11_state.NotImplemented:
        return True  # valid, with no CPU kernel for a low type: runs where one exists
    except Exception:
        return False
    return True
