"""The faithful CPU evaluator: every low-precision value rounded (and overflowing) as the low
type does, checked against onnx.reference, which computes in the stored types."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import graphamp.onnx as gonnx
from graphamp.onnx.numerics.runtime import run
from tests.helpers import model


def overflowing(scale: float) -> onnx.ModelProto:
    """x -> MatMul(w1) -> Relu -> MatMul(w2) -> y; with a large ``scale`` the hidden layer
    leaves float16's range (w1 itself fits it)."""
    rng = np.random.default_rng(0)
    w1 = (np.abs(rng.standard_normal((4, 4))) * scale).astype(np.float32)
    w2 = (rng.standard_normal((4, 4)) * 1e-3).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")]
    return model(nodes, initializers=inits)


def feeds() -> dict[str, np.ndarray]:
    x = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32) * 3
    x[x == 0] = 0.5
    return {"x": x}


def reference(proto: onnx.ModelProto) -> np.ndarray:
    float16 = proto.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    typed = {"x": feeds()["x"].astype(np.float16 if float16 else np.float32)}
    return ReferenceEvaluator(proto).run(None, typed)[0].astype(np.float64)


def test_emulation_agrees_with_onnx_reference_on_healthy_and_overflowing_models():
    for scale, overflow in ((0.5, False), (2.5e4, True)):
        converted = gonnx.convert(overflowing(scale)).to_proto()
        emulated, evaluator = run(converted, feeds())
        assert "float16 rounding emulated" in evaluator
        got = emulated["y"].astype(np.float64)
        want = reference(converted)
        assert (np.isfinite(got) == np.isfinite(want)).all()
        assert bool((~np.isfinite(got)).any()) == overflow
        finite = np.isfinite(want)
        scale_y = np.abs(want[finite]).max() if finite.any() else 1.0
        assert np.abs(got[finite] - want[finite]).max() <= 2e-3 * scale_y


def test_verify_reports_the_overflow_the_cpu_provider_hides(cli, tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(overflowing(2.5e4), str(source))
    result = cli("convert", str(source), "-o", str(tmp_path / "o.onnx"), "--verify")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "float16 rounding emulated" in result.stdout
    assert "OVER" in result.stdout


def fused_float16(value_info: bool) -> onnx.ModelProto:
    """x -> Cast(float16) -> com.microsoft FastGelu -> Mul -> Cast(float32) -> y, as another
    tool writes it: no value_info, so onnx's inference types neither the FastGelu's output nor
    the Mul's."""
    F16 = onnx.TensorProto.FLOAT16
    nodes = [
        helper.make_node("Cast", ["x"], ["x16"], to=F16, name="to16"),
        helper.make_node("FastGelu", ["x16"], ["g"], domain="com.microsoft", name="gelu"),
        helper.make_node("Mul", ["g", "g"], ["m"], name="square"),
        helper.make_node("Cast", ["m"], ["y"], to=onnx.TensorProto.FLOAT, name="to32"),
    ]
    graph = helper.make_graph(
        nodes,
        "fused",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 4])],
    )
    if value_info:
        graph.value_info.extend(helper.make_tensor_value_info(n, F16, [4, 4]) for n in "gm")
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    proto = helper.make_model(graph, opset_imports=opsets)
    proto.ir_version = 8
    return proto


def test_values_after_an_onnxruntime_op_are_rounded_without_value_info(monkeypatch):
    """The types onnx's inference leaves out after a com.microsoft op come from onnxruntime's
    symbolic inference: the model rounds as the same model with its value_info does; where
    neither knows a type, the evaluator says how many values it did not round."""
    from graphamp.onnx.numerics import runtime

    types, untyped = runtime.emulation_types(fused_float16(value_info=False))
    assert untyped == 0 and types["g"] == types["m"] == onnx.TensorProto.FLOAT16
    bare, label = run(fused_float16(value_info=False), feeds())
    typed, _ = run(fused_float16(value_info=True), feeds())
    assert np.array_equal(bare["y"], typed["y"]) and "unknown type" not in label
    monkeypatch.setattr(runtime, "_runtime_types", lambda model: {})
    _, label = run(fused_float16(value_info=False), feeds())
    assert "float16 rounding emulated (2 values of unknown type not rounded)" in label


def test_types_from_onnxruntime_leave_no_file_behind(tmp_path, monkeypatch):
    """onnxruntime's ``infer_shapes`` saves the model into the current folder where it cannot
    type everything (``sym_shape_infer_temp.onnx``, its data beside) and raises: graphamp
    runs its steps itself, so nothing lands in the user's folder, and the types found stay."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    from graphamp.onnx.numerics import runtime

    def saves_and_raises(model, **options):  # type: ignore[no-untyped-def]  # (what it does)
        onnx.save_model(model, "sym_shape_infer_temp.onnx")
        raise Exception("Incomplete symbolic shape inference")

    monkeypatch.setattr(SymbolicShapeInference, "infer_shapes", staticmethod(saves_and_raises))
    monkeypatch.chdir(tmp_path)
    types, untyped = runtime.emulation_types(fused_float16(value_info=False))
    assert untyped == 0 and types["m"] == onnx.TensorProto.FLOAT16
    assert list(tmp_path.iterdir()) == []


def test_a_large_weight_an_op_reads_does_not_stop_the_types_after_an_onnxruntime_op():
    """A position table of 1,024 elements added to the input (large weights reach the type
    inference as shapes without data): onnxruntime's symbolic inference reads the values of
    what an Add reads, so it is handed large weights as typed inputs, and still types the
    values after the com.microsoft op."""
    from graphamp.onnx.numerics import runtime

    F16 = onnx.TensorProto.FLOAT16
    table = np.random.default_rng(0).standard_normal((1, 16, 64)).astype(np.float16)
    nodes = [
        helper.make_node("Add", ["x", "positions"], ["e"], name="add"),
        helper.make_node("FastGelu", ["e"], ["g"], domain="com.microsoft", name="gelu"),
        helper.make_node("Mul", ["g", "g"], ["y"], name="square"),
    ]
    graph = helper.make_graph(
        nodes,
        "positions",
        [helper.make_tensor_value_info("x", F16, [1, 16, 64])],
        [helper.make_tensor_value_info("y", F16, [1, 16, 64])],
        [numpy_helper.from_array(table, "positions")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    proto = helper.make_model(graph, opset_imports=opsets)
    proto.ir_version = 8
    types, untyped = runtime.emulation_types(proto)
    assert untyped == 0 and types["g"] == F16
