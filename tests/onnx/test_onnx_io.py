"""Reading and writing ONNX: external data, unnamed nodes, custom-domain ops, missing types."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

import graphamp.onnx as gonnx
from tests.helpers import assert_valid, convert, model, run, weight


def test_external_data_model_loads_converts_and_saves_with_external_data(tmp_path):
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Relu", ["m"], ["y"], name="relu"),
    ]
    proto = model(nodes, initializers=[weight("w", (64, 64))], shape=(64, 64))
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    expected = run(proto, {"x": x})[0]  # before saving: onnx.save moves the data out of proto
    source = tmp_path / "ext.onnx"
    onnx.save(
        proto, str(source), save_as_external_data=True, location="ext.onnx.data", size_threshold=0
    )
    assert (tmp_path / "ext.onnx.data").exists()
    result = gonnx.convert(source)
    target = tmp_path / "out" / "converted.onnx"
    target.parent.mkdir()
    gonnx.save(result.model, target)
    assert (target.parent / "converted.onnx.data").exists()
    loaded = onnx.load(str(target))
    assert_valid(loaded)
    assert (
        np.abs(run(loaded, {"x": x})[0].astype(np.float32) - expected).max()
        < 1e-2 * np.abs(expected).max()
    )


def test_unnamed_nodes_get_deterministic_names_from_their_outputs():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    out, plan = convert(model(nodes, initializers=[weight("w")]))
    assert set(plan.nodes) == {"MatMul__m", "Relu__y"}
    assert [n.name for n in out.graph.node] == ["MatMul__m", "Relu__y"]


def test_custom_domain_op_is_kept_as_it_is_with_casts_around_it():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Foo", ["m"], ["f"], name="custom", domain="my.ops"),
        helper.make_node("MatMul", ["f", "w"], ["y"], name="mm2"),
    ]
    proto = model(nodes, initializers=[weight("w")])
    proto.opset_import.append(helper.make_opsetid("my.ops", 1))
    # inference cannot type what follows an op it does not know: the output declares its shape
    proto.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4]))
    out, plan = convert(proto)
    assert_valid(out)
    assert plan.nodes["custom"].rule == "opaque"
    assert plan.nodes["mm"].precision == plan.nodes["mm2"].precision == "float16"
    # The custom op reads the float32 it always read; its untyped output is cast for mm2:
    # the missing type did not make the pass skip that cast.
    by_tensor = {(c.tensor, c.dst) for c in plan.casts}
    assert by_tensor == {("m", "float32"), ("f", "float16")}
    custom = next(n for n in out.graph.node if n.name == "custom")
    assert custom.input[0] == "m__float32"


def test_graph_input_retyped_only_when_every_reader_wants_low():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Exp", ["x"], ["e"], name="exp"),
    ]
    out, plan = convert(model(nodes, outputs=("m", "e"), initializers=[weight("w")]))
    assert out.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert [(c.tensor, c.dst) for c in plan.casts] == [("x", "float16")]
    assert_valid(out)
