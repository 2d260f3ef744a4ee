"""Engine bugs the fuzz harness (tools/fuzz.py) found, each as the smallest graph that shows
it: converting must be a fixed point, valid, and add no Cast that one already in the model
(or another inserted one) makes redundant."""

from __future__ import annotations

import contextlib

from onnx import TensorProto, helper

from tests.helpers import assert_valid, convert, model, weight


def assert_fixed_point(proto, **policy) -> None:  # type: ignore[no-untyped-def]
    first, _ = convert(proto, **policy)
    again, _ = convert(first, **policy)
    assert again.SerializeToString() == first.SerializeToString()
    assert_valid(first)


def test_a_dead_cast_chain_in_the_model_is_left_as_it_is():
    """x -> Cast(int32) -> Cast(float32), read by nothing: the first conversion removed the
    outer Cast only, so the second removed the inner one (fuzz seed 80)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
        helper.make_node("Cast", ["x"], ["as_int"], name="down", to=TensorProto.INT32),
        helper.make_node("Cast", ["as_int"], ["back"], name="up", to=TensorProto.FLOAT),
    ]
    proto = model(nodes, initializers=[weight("w")])
    assert_fixed_point(proto)
    first, _ = convert(proto)
    assert {n.name for n in first.graph.node} >= {"down", "up"}


def clip_model(opset: int):  # type: ignore[no-untyped-def]
    import numpy as np
    from onnx import numpy_helper

    bounds = [
        numpy_helper.from_array(np.array(v, np.float32), n) for n, v in [("lo", -1), ("hi", 1)]
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Clip", ["m", "lo", "hi"], ["y"], name="clip"),
    ]
    return model(nodes, initializers=[weight("w"), *bounds], opset=opset)


def test_clip_stays_float32_in_bfloat16_before_opset_16_so_onnxruntime_loads_it():
    """Clip's schema admits bfloat16 from opset 13, but onnxruntime (no kernel) expands its
    function body, whose Where takes bfloat16 only from opset 16: the output was refused
    (INVALID_GRAPH), an internal error for the user (fuzz seed 180)."""
    import onnxruntime as ort

    for opset, clip_precision in ((15, "float32"), (16, "bfloat16")):
        out, plan = convert(clip_model(opset), dtype="bfloat16", allow=["Clip"])
        assert plan.nodes["clip"].precision == clip_precision
        assert_valid(out)
        options = ort.SessionOptions()
        options.log_severity_level = 4
        # no bfloat16 kernel on the CPU provider is fine (a valid model, run elsewhere)
        with contextlib.suppress(ort.capi.onnxruntime_pybind11_state.NotImplemented):
            ort.InferenceSession(
                out.SerializeToString(), options, providers=["CPUExecutionProvider"]
            )
        if opset == 15:
            assert "onnxruntime loads Clip in bfloat16 from 16" in plan.nodes["clip"].reason
