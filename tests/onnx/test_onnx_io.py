"""Reading and writing ONNX: external data, unnamed nodes, custom-domain ops, missing types."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphamp.onnx as gonnx
from graphamp.errors import GraphampError, PolicyWarning
from tests.helpers import assert_valid, chain, convert, model, run, weight


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


def _bytes_of(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_save_refuses_to_write_over_the_file_the_model_was_read_from(tmp_path):
    """graphamp.onnx.save, like the command line, never writes over its input unasked: the
    model file of convert(path) or load(path), nor the external data file it reads. One
    GraphampError naming the file, nothing written; overwrite=True writes."""
    source = tmp_path / "model.onnx"
    onnx.save(chain(["MatMul", "Relu", "MatMul"]), str(source))
    before = _bytes_of(tmp_path)
    for read in (gonnx.convert(source).model, gonnx.load(source)):
        with pytest.raises(GraphampError, match=r"would overwrite .*model\.onnx.*overwrite=True"):
            gonnx.save(read, tmp_path / "." / "model.onnx")
        assert _bytes_of(tmp_path) == before
    gonnx.save(gonnx.convert(source).model, tmp_path / "model.fp16.onnx")  # a new file: fine
    gonnx.save(gonnx.convert(source).model, source, overwrite=True)
    assert source.read_bytes() != before["model.onnx"]
    assert_valid(onnx.load(str(source)))


def test_save_refuses_to_write_over_the_external_data_the_model_reads(tmp_path):
    """A model read with its weights in a data file: saving over the model, or to a name
    whose data file is the one it reads, is refused and leaves both files as they were."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    proto = model(nodes, initializers=[weight("w", (64, 64))], shape=(64, 64))
    source = tmp_path / "model.onnx"
    onnx.save(proto, str(source), save_as_external_data=True, location="w.onnx.data")
    before = _bytes_of(tmp_path)
    result = gonnx.convert(source)
    for target, read in (("model.onnx", "model.onnx"), ("w.onnx", "w.onnx.data")):
        with pytest.raises(GraphampError, match=rf"would overwrite .*{read}, which the model"):
            gonnx.save(result.model, tmp_path / target)
        assert _bytes_of(tmp_path) == before


def test_strict_makes_a_rule_that_matches_nothing_an_error(tmp_path):
    """strict=True is --strict for graphamp.onnx.convert and analyse."""
    proto = chain(["MatMul", "Softmax", "MatMul"])
    with pytest.warns(PolicyWarning, match="Softmx"):
        gonnx.convert(proto, deny=["Softmx"])
    for function in (gonnx.convert, gonnx.analyse):
        with pytest.raises(GraphampError, match="Softmx"):
            function(proto, deny=["Softmx"], strict=True)


def test_save_refuses_a_path_it_cannot_write_the_model_to_in_one_line(tmp_path):
    """A missing folder was an OSError naming graphamp's hidden temporary file, a folder an
    IsADirectoryError, and model.pt2 got ONNX bytes the CLI then refuses as a program."""
    result = gonnx.convert(chain(["MatMul", "Relu"]))
    for target, message in (
        (tmp_path / "missing" / "m.onnx", "does not exist"),
        (tmp_path, "is a folder"),
        (tmp_path / "m.pt2", ".pt2 names a pt2 file, but this is an ONNX model"),
    ):
        with pytest.raises(GraphampError, match=message):
            gonnx.save(result, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    gonnx.save(result, tmp_path / "m.fp16")  # a name no format claims is the user's choice
    assert onnx.load(str(tmp_path / "m.fp16")).graph.node
