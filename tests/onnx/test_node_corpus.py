"""ONNX's own node test cases (``onnx.backend.test.case.node``), every one with float inputs,
converted to float16 and bfloat16: no crash, a fixed point, and an output that loads and
computes what the original computes.

The converted model is compared with the original on the same evaluator (onnxruntime's CPU
provider, or ``onnx.reference`` for a bfloat16 model the CPU provider has no kernel for), on
the case's own inputs, and with the case's expected outputs wherever the evaluator reproduces
them on the float32 original (onnxruntime itself departs from a few of them).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator

import graphamp.onnx as gonnx
from graphamp.models.onnx_cases import feeds_for
from tests.onnx.node_cases import TOLERANCE, float_cases, relative_error


def session(proto: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    return ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def run(proto: onnx.ModelProto, inputs: list, reference: bool) -> list[np.ndarray]:
    feeds = feeds_for(proto, inputs)
    if reference:
        return ReferenceEvaluator(proto).run(None, feeds)
    return session(proto).run(None, feeds)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_float_node_case_converts_to_a_fixed_point_that_runs(dtype):
    checked, compared, against_expected = 0, 0, 0
    failures = []
    for case in float_cases():
        original = case.model
        try:
            session(original)
        except Exception:  # onnxruntime refuses the original (an op it lacks): only convert
            original_loads = False
        else:
            original_loads = True
        converted = gonnx.convert(original, dtype=dtype).to_proto()
        again = gonnx.convert(converted, dtype=dtype).to_proto()
        if again.SerializeToString() != converted.SerializeToString():
            failures.append((case.name, "not a fixed point"))
            continue
        checked += 1
        if not original_loads:
            continue
        inputs = case.data_sets[0][0]
        try:
            session(converted)
            # onnxruntime's Python API takes no bfloat16 arrays: such inputs go to onnx.reference
            reference = any(
                i.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
                for i in converted.graph.input
            )
        except ort.capi.onnxruntime_pybind11_state.NotImplemented:
            reference = dtype == "bfloat16"  # no bfloat16 kernel on the CPU provider
            if not reference:
                failures.append((case.name, "onnxruntime has no kernel for the output"))
                continue
        except Exception as exc:
            failures.append((case.name, f"onnxruntime refuses the output: {str(exc)[:120]}"))
            continue
        try:
            want = run(original, inputs, reference)
        except Exception:
            continue  # the evaluator cannot run the original on these inputs
        got = run(converted, inputs, reference)
        expected = [e if isinstance(e, np.ndarray) else None for e in case.data_sets[0][1]]
        names = [o.name for o in original.graph.output]
        for name, a, b, e in zip(names, got, want, expected, strict=False):
            if not isinstance(b, np.ndarray) or b.dtype.kind != "f":
                continue  # sequences and integer outputs are not what precision changes
            try:
                error = relative_error(a, b)
            except AssertionError as exc:
                failures.append((case.name, f"{name}: {exc}"))
                break
            if error > TOLERANCE[dtype]:
                failures.append((case.name, f"{name}: error {error:.3g}"))
                break
            if e is not None and e.shape == b.shape and e.dtype.kind == "f" and _close(b, e):
                against_expected += 1  # the evaluator reproduces the case on float32
                error = relative_error(a, e)
                if error > TOLERANCE[dtype]:
                    failures.append((case.name, f"{name}: error {error:.3g} to expected"))
                    break
        compared += 1
    assert not failures, failures
    assert checked > 1300 and compared > 1000 and against_expected > 900, (
        checked,
        compared,
        against_expected,
    )


def _close(got: np.ndarray, expected: np.ndarray) -> bool:
    try:
        return relative_error(got, expected) < 1e-4
    except AssertionError:
        return False
