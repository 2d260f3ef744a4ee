"""Engine bugs the fuzz harness (tools/fuzz/fuzz.py) found, each as the smallest graph that shows
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
    (INVALID_GRAPH), an internal error for the user (fuzz seed 180). Target "any": no
    provider has a bfloat16 Clip kernel, so cuda and cpu keep it float32 by rule no_kernel."""
    import onnxruntime as ort

    for opset, clip_precision in ((15, "float32"), (16, "bfloat16")):
        out, plan = convert(clip_model(opset), dtype="bfloat16", allow=["Clip"], target="any")
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


def test_a_widening_cast_whose_input_cast_was_removed_is_read_through_to_its_source():
    """m (now float16) -> Cast(float16) (a no-op, removed) -> Cast(float32) read by a float32
    node and by a float16 Concat: the Concat was rewired to the removed Cast's output, and
    writing the model failed (an internal error; fuzz seed 206)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Cast", ["m"], ["m_low"], name="down", to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["m_low"], ["m_back"], name="up", to=TensorProto.FLOAT),
        helper.make_node("Concat", ["m", "m_back"], ["cat"], name="cat", axis=1),
        helper.make_node("MatMul", ["cat", "w2"], ["y"], name="mm2"),
        helper.make_node("Relu", ["m_back"], ["z"], name="kept"),
    ]
    proto = model(nodes, outputs=("y", "z"), initializers=[weight("w"), weight("w2", (8, 4))])
    out, plan = convert(proto, deny_names=["kept"])
    assert plan.nodes["cat"].precision == "float16"
    cat = next(n for n in out.graph.node if n.name == "cat")
    assert list(cat.input) == ["m", "m"]  # both read the float16 m itself
    assert_fixed_point(proto, deny_names=["kept"])


def casts_of(proto, tensor: str, to: int) -> list[str]:  # type: ignore[no-untyped-def]
    return [
        n.name
        for n in proto.graph.node
        if n.op_type == "Cast" and n.input[0] == tensor and n.attribute[0].i == to
    ]


def island_model(cast_first: bool):  # type: ignore[no-untyped-def]
    """x feeds a MatMul (float16 after conversion) and the model's own float16 island
    Cast(x -> float16) -> Tanh -> Cast(float32), the island before or after the MatMul."""
    island = [
        helper.make_node("Cast", ["x"], ["x_half"], name="own_cast", to=TensorProto.FLOAT16),
        helper.make_node("Tanh", ["x_half"], ["t_half"], name="tanh"),
        helper.make_node("Cast", ["t_half"], ["t"], name="own_back", to=TensorProto.FLOAT),
    ]
    matmul = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm")]
    tail = [helper.make_node("Add", ["m", "t"], ["y"], name="add")]
    nodes = (island + matmul if cast_first else matmul + island) + tail
    return model(nodes, initializers=[weight("w")])


def test_a_cast_the_model_already_has_is_shared_not_doubled():
    """The model's Cast(x -> float16) and the one the MatMul needs were two Casts of the same
    (tensor, dtype) (fuzz seeds 9, 79): now one, wherever the model's Cast sits. (A model that
    computes in float16 keeps its float32 ops, rule kept: allow_names lowers the MatMul.)"""
    for cast_first in (True, False):
        proto = island_model(cast_first)
        out, plan = convert(proto, keep_io_types=True, allow_names=["mm"])
        assert plan.nodes["mm"].precision == "float16"
        assert len(casts_of(out, "x", TensorProto.FLOAT16)) == 1, cast_first
        assert_fixed_point(proto, keep_io_types=True, allow_names=["mm"])
    first, _ = convert(island_model(cast_first=True), keep_io_types=True, allow_names=["mm"])
    assert casts_of(first, "x", TensorProto.FLOAT16) == ["own_cast"]


def test_a_cast_reads_from_before_the_models_widening_cast():
    """x -> Cast(bfloat16) -> Cast(float32), read by a float32 Relu and by a MatMul in
    float16: the MatMul's Cast to float16 read the widening Cast's output, a pair that one Cast
    does (bfloat16 -> float16; fuzz seed 27)."""
    nodes = [
        helper.make_node("Cast", ["x"], ["x_bf"], name="down", to=TensorProto.BFLOAT16),
        helper.make_node("Cast", ["x_bf"], ["x_back"], name="up", to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["x_back", "w"], ["y"], name="mm"),
        helper.make_node("Relu", ["x_back"], ["z"], name="kept"),
    ]
    proto = model(nodes, outputs=("y", "z"), initializers=[weight("w")])
    out, plan = convert(proto, deny_names=["kept"])
    assert plan.nodes["mm"].precision == "float16"
    assert casts_of(out, "x_bf", TensorProto.FLOAT16) == ["x_bf__float16"]
    assert not casts_of(out, "x_back", TensorProto.FLOAT16)
    assert_fixed_point(proto, deny_names=["kept"])


def test_a_float16_reader_through_a_removed_cast_of_a_kept_output_reads_float16():
    """m is a kept output (cast back to float32 under its name); the model's Cast(m -> float16)
    became a no-op and was removed, and its float16 reader was rewired to the name m, which
    is the float32 Cast back: a float16 MatMul read float32 (an invalid model; fuzz seed 78)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Cast", ["m"], ["m_half"], name="c", to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["m_half"], ["m_back"], name="c2", to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["m_back", "w2"], ["y"], name="mm2"),
    ]
    proto = model(nodes, outputs=("m", "y"), initializers=[weight("w"), weight("w2")])
    out, plan = convert(proto, keep_io_types=["m"])
    assert plan.nodes["mm2"].precision == "float16"
    mm2 = next(n for n in out.graph.node if n.name == "mm2")
    assert mm2.input[0] == "m__float16"
    assert_fixed_point(proto, keep_io_types=["m"])


def test_a_model_cast_of_a_kept_output_to_its_own_type_goes():
    """The model's bfloat16 round trip of an output kept float32 (Cast(m -> bfloat16) ->
    Cast(float32)) read the float32 Cast back after the conversion: a Cast to the type its
    input has, removed only by a second conversion (fuzz seed 78)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Cast", ["m"], ["m_bf"], name="down", to=TensorProto.BFLOAT16),
        helper.make_node("Cast", ["m_bf"], ["m_back"], name="up", to=TensorProto.FLOAT),
        helper.make_node("Relu", ["m_back"], ["y"], name="kept"),
    ]
    proto = model(nodes, outputs=("m", "y"), initializers=[weight("w")])
    policy = {"dtype": "bfloat16", "keep_io_types": True, "deny_names": ["kept"]}
    out, _ = convert(proto, **policy)
    assert [n.op_type for n in out.graph.node] == ["Cast", "MatMul", "Cast", "Relu"]
    relu = next(n for n in out.graph.node if n.name == "kept")
    assert relu.input[0] == "m"  # the Cast back
    assert_fixed_point(proto, **policy)
