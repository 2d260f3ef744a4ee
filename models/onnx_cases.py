"""ONNX's node test cases (``onnx.backend.test``) as the tests and the benchmarks feed them: each
case's inputs in the types its model declares, and whether onnxruntime loads a model."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from graphamp.core import dtypes


def feeds_for(proto: onnx.ModelProto, inputs: Sequence[object]) -> dict[str, object]:
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
    """Whether onnxruntime's CPU provider loads ``proto``, or rejects it only for want of a
    kernel in a low type (valid: it runs where such a kernel exists)."""
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except ort.capi.onnxruntime_pybind11_state.NotImplemented:
        return True
    except Exception:
        return False
    return True
