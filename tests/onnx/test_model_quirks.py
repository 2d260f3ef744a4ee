"""Models onnxruntime loads that graphamp refused or converted into invalid models:
nodes out of topological order, IR-3 models whose initializers are not graph inputs, old
opsets, declared types that type inference contradicts, and token ids beyond an embedding.
Each is converted into a model the full checker accepts and onnxruntime runs, with the
numbers of the float32 model, or refused in one line with exit status 2."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphamp.onnx as gonnx
from graphamp.cli import main
from graphamp.errors import GraphampError, RepairWarning
from graphamp.numerics.verify import verify
from tests.helpers import conv_net

F32 = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def assert_converts_faithfully(
    model: onnx.ModelProto, reference: onnx.ModelProto | None = None, **policy: object
) -> onnx.ModelProto:
    """Converted: the full checker accepts it, onnxruntime runs it, and the faithful
    evaluator finds float16's error against the float32 model (``reference``: the model
    as it should have been) small and finite."""
    converted = gonnx.convert(model, dtype="float16", **policy).to_proto()
    onnx.checker.check_model(converted, full_check=True)
    ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)}
    report = verify(reference or model, converted, feeds, rtol=1e-2)
    assert report.ok, report
    assert all(output.nan_inf == 0 for output in report.outputs)
    return converted


@pytest.mark.slow
def test_every_opset_onnxruntime_loads_converts():
    """Opsets 7 to the newest onnx knows: each one onnxruntime loads converts faithfully (an
    opset onnx knows and onnxruntime does not yet, it refuses: nothing to convert there)."""
    loaded = []
    for opset in range(7, onnx.defs.onnx_opset_version() + 1):
        model = conv_net(opset, ir_version=3 if opset < 8 else 8)
        if opset < 8:  # IR 3 wanted every initializer to be a graph input too
            for tensor in model.graph.initializer:
                info = helper.make_tensor_value_info(tensor.name, F32, tensor.dims)
                model.graph.input.append(info)
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception as exc:
            assert f"Opset {opset}" in str(exc)  # newer than this onnxruntime
            continue
        loaded.append(opset)
        for keep in (True, False):
            assert_converts_faithfully(model, keep_io_types=keep)
    assert loaded[:16] == list(range(7, 23))


def test_an_opset_before_cast_6_is_refused_naming_the_oldest(tmp_path, capsys):
    model = conv_net(1, ir_version=3)
    path = tmp_path / "old.onnx"
    onnx.save(model, str(path))
    assert main(["convert", str(path), "-o", str(tmp_path / "out.onnx")]) == 2
    err = capsys.readouterr().err
    assert "default-domain opset 1 is older than graphamp converts (opset 6" in err
    assert "onnx.version_converter" in err and not (tmp_path / "out.onnx").exists()


def test_an_ir3_model_whose_initializers_are_not_inputs_converts():
    """onnxruntime loads it (the checker does not): the output says IR 4, where that is
    allowed, and the weights stay weights, not new graph inputs."""
    model = conv_net(7, ir_version=3)
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    converted = assert_converts_faithfully(model, keep_io_types=True)
    assert converted.ir_version == 4
    assert [i.name for i in converted.graph.input] == ["x"]


def test_nodes_out_of_order_are_sorted_and_a_cycle_is_named():
    model = conv_net()
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))  # onnxruntime sorts them; so does graphamp
    source = copy.deepcopy(model)
    converted = assert_converts_faithfully(model, keep_io_types=True)
    assert model == source  # the caller's model is not sorted in place
    order = [n.name for n in converted.graph.node if n.op_type != "Cast"]
    assert order == [n.name for n in nodes]
    again = gonnx.convert(converted, dtype="float16", keep_io_types=True).to_proto()
    assert again.SerializeToString() == converted.SerializeToString()
    cyclic = conv_net()
    cyclic.graph.node[1].input[0] = "a"  # relu reads add's output: conv is left dangling
    with pytest.raises(GraphampError, match="cycle: relu -> mm -> add -> relu"):
        gonnx.convert(cyclic)


def damaged(kind: str) -> onnx.ModelProto:
    """A Conv model with one declaration damaged as a single changed byte would."""
    model = conv_net()
    output, info = model.graph.output[0].type.tensor_type, model.graph.value_info[0]
    if kind == "output lost its shape":
        output.ClearField("shape")
    elif kind == "output lost its element type":
        output.ClearField("elem_type")
    elif kind == "output type is empty":  # the type field kept, holding nothing (seed 8456)
        model.graph.output[0].type.ClearField("tensor_type")
        model.graph.output[0].type.SetInParent()
    elif kind == "value_info kind contradicts":  # a sequence declared for a tensor
        info.type.ClearField("tensor_type")
        info.type.sequence_type.elem_type.tensor_type.elem_type = F32
    elif kind == "output dim contradicts":
        output.shape.dim[2].dim_value = 4
    elif kind == "output rank contradicts":
        del output.shape.dim[3]
    elif kind == "output type contradicts":
        output.elem_type = TensorProto.DOUBLE
    elif kind == "value_info dim contradicts":
        info.type.tensor_type.shape.dim[3].dim_value = 7
    elif kind == "value_info type contradicts":
        info.type.tensor_type.elem_type = TensorProto.DOUBLE
    return model


@pytest.mark.parametrize(
    "kind",
    [
        "output lost its shape",
        "output lost its element type",
        "output type is empty",
        "output dim contradicts",
        "output rank contradicts",
        "output type contradicts",
        "value_info dim contradicts",
        "value_info type contradicts",
        "value_info kind contradicts",
    ],
)
def test_declarations_inference_contradicts_are_repaired_with_a_note(kind):
    model = damaged(kind)
    with pytest.raises((onnx.checker.ValidationError, onnx.shape_inference.InferenceError)):
        onnx.checker.check_model(model, full_check=True)
    if kind.startswith("output lost") or kind == "output type is empty":
        # completed: nothing the model said is overridden
        with warnings.catch_warnings():
            warnings.simplefilter("error", RepairWarning)
            converted = assert_converts_faithfully(model, conv_net(), keep_io_types=True)
        assert converted.graph.output[0] == conv_net().graph.output[0]
        return
    with pytest.warns(RepairWarning, match="contradicted type inference .*: repaired with"):
        assert_converts_faithfully(model, conv_net(), keep_io_types=True)


def test_a_contradiction_repair_cannot_settle_is_refused(tmp_path, capsys):
    """Only the main graph's declarations are repaired: one inside an If branch that type
    inference contradicts stays, and the model is refused in one line."""
    branch = helper.make_graph(
        [
            helper.make_node("Relu", ["c"], ["mid"], name="inner_relu"),
            helper.make_node("Relu", ["mid"], ["inner"], name="inner_relu2"),
        ],
        "branch",
        [],
        [helper.make_tensor_value_info("inner", F32, [1, 3, 3, 3])],
        value_info=[helper.make_tensor_value_info("mid", F32, [1, 3, 9, 3])],
    )
    model = conv_net()
    model.graph.initializer.append(numpy_helper.from_array(np.array(True), "flag"))
    relu = model.graph.node[1]
    relu.op_type, relu.input[:] = "If", ["flag"]
    relu.attribute.extend(
        [helper.make_attribute("then_branch", branch), helper.make_attribute("else_branch", branch)]
    )
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    assert main(["convert", str(path), "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "type inference refuses the model" in err[0], err
    assert not (tmp_path / "o.onnx").exists()


def test_token_ids_beyond_the_embedding_name_the_array_and_the_bound(tmp_path, capsys):
    table = numpy_helper.from_array(RNG.standard_normal((10, 4)).astype("f4"), "table")
    weight = numpy_helper.from_array(RNG.standard_normal((4, 4)).astype("f4"), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
            helper.make_node("MatMul", ["e", "w"], ["y"], name="mm"),
        ],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("y", F32, [2, 3, 4])],
        [table, weight],
    )
    path = tmp_path / "emb.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    out = tmp_path / "o.onnx"
    for bad, expected in ((30, "holds id 30"), (-11, "holds id -11")):
        data = tmp_path / "ids.npz"
        np.savez(data, ids=np.array([[1, 2, bad], [0, 1, 2]], np.int64))
        argv = ["convert", str(path), "-o", str(out), "--verify", "--inputs", str(data)]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"array 'ids' {expected}, beyond the 10 rows" in err and "-10 to 9" in err
        assert not out.exists()
    np.savez(data, ids=np.array([[1, 2, 9], [0, -10, 2]], np.int64))
    assert main(["convert", str(path), "-o", str(out), "--verify", "--inputs", str(data)]) == 0


def test_a_node_whose_types_its_schema_refuses_is_refused(tmp_path, capsys):
    """A ReduceMin-18 whose axes are float (int64 in its schema): onnxruntime refuses to load
    the model, the full checker refuses it; graphamp converted it (exit 0) into a model as
    invalid. It is refused in one line naming the node, and nothing is written."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("ReduceMin", ["m", "axes"], ["y"], name="reduce", keepdims=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F32, [2, 3])],
        [helper.make_tensor_value_info("y", F32, None)],
        [
            numpy_helper.from_array(RNG.standard_normal((3, 3)).astype("f4"), "w"),
            numpy_helper.from_array(np.array([1.0], np.float32), "axes"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidGraph, match="Type Error"):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert main(["convert", str(path), "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "type inference refuses the model" in err[0], err
    assert "reduce" in err[0] and "ReduceMin" in err[0], err
    assert not (tmp_path / "o.onnx").exists()


def test_a_graph_input_without_a_shape_is_refused_naming_it(tmp_path, capsys):
    """Seed 3556: a graph input whose type lost its ``shape`` field. onnxruntime loads it, the
    full checker refuses it, and inference cannot settle an input's shape (it starts from it):
    refused in one line naming the input, nothing written."""
    model = conv_net()
    model.graph.input[0].type.tensor_type.ClearField("shape")
    with pytest.raises(onnx.checker.ValidationError, match="'shape' of 'type' is required"):
        onnx.checker.check_model(model, full_check=True)
    path, out, plan = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "o.txt"
    onnx.save(model, str(path))
    for argv, written in (
        (["convert", str(path), "-o", str(out)], out),
        (["plan", str(path), "-o", str(plan)], plan),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "graph input 'x' declares no shape" in err[0], err
        assert str(path) in err[0] and not written.exists()


def ir3_slice() -> onnx.ModelProto:
    """x[2, 8] -> Slice(starts 4, ends 8, axes 1) -> [2, 4] -> Relu, at IR version 3 with the
    Slice's inputs stored as initializers but not declared as graph inputs (seed 6676)."""
    stored = [
        numpy_helper.from_array(np.array([value], np.int64), name)
        for name, value in (("starts", 4), ("ends", 8), ("axes", 1))
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"], name="slice"),
            helper.make_node("Relu", ["s"], ["y"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info("x", F32, [2, 8])],
        [helper.make_tensor_value_info("y", F32, [2, 4])],
        stored,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 3
    return model


def test_an_ir3_model_is_typed_as_the_ir4_model_it_is_written_as(tmp_path, capsys):
    """onnx infers an IR-3 model's Slice without its stored axes (a [0, 8] slice of [2, 8]):
    graphamp wrote that shape into the output's value_info, where the checker found it
    contradicted. Inferred as IR 4, the shape is [2, 4]; nothing converts, and the output is
    the model at IR 4, which the full checker accepts."""
    model = ir3_slice()
    wrong = onnx.shape_inference.infer_shapes(model)
    slice_dims = [d.dim_value for d in wrong.graph.value_info[0].type.tensor_type.shape.dim]
    assert slice_dims != [2, 4]  # onnx's inference of the IR-3 model, the cause
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    path, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, str(path))
    assert main(["convert", str(path), "-o", str(out), "--deny", "Relu"]) == 0
    assert "nothing converted" in capsys.readouterr().err
    written = onnx.load(str(out))
    onnx.checker.check_model(written, full_check=True)
    assert written.ir_version == 4
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in written.graph.value_info}  # fmt: skip
    assert shapes.get("s", [2, 4]) == [2, 4]


def test_nothing_converted_copies_the_input_only_where_the_checker_passes_it(tmp_path, capsys):
    """Seed 8456: a graph output whose type holds nothing, in a model where nothing converts.
    The input's own bytes would be a file the full checker refuses: the output is written
    with the inferred type instead. A sound model where nothing converts is still copied."""
    model = conv_net()
    model.graph.output[0].type.ClearField("tensor_type")
    model.graph.output[0].type.SetInParent()
    path, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, str(path))
    deny = ["--deny", "Conv,MatMul,Relu,Add,Exp,Softmax"]
    assert main(["convert", str(path), "-o", str(out), *deny]) == 0
    assert "nothing converted" in capsys.readouterr().err
    assert out.read_bytes() != path.read_bytes()
    onnx.checker.check_model(str(out), full_check=True)
    assert onnx.load(str(out)).graph.output[0] == conv_net().graph.output[0]
    onnx.save(conv_net(), str(path))
    assert main(["convert", str(path), "-o", str(out), *deny]) == 0
    assert out.read_bytes() == path.read_bytes()


def test_an_always_made_output_without_a_name_is_refused_naming_the_node(tmp_path, capsys):
    """Fuzz seeds 14836, 28644, 29124: a node whose single output's name is empty. The checker
    refuses it, graphamp converted it (or crashed on a MatMul's missing output, exit 3). It is
    refused naming the node, also where an earlier node of the op had its output named (the
    validator checks each node signature once)."""
    model = conv_net()
    model.graph.node.insert(3, helper.make_node("Relu", ["m"], ["unused"], name="extra"))
    model.graph.node.insert(4, helper.make_node("Relu", ["m"], [""], name="nameless"))
    path, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, str(path))
    with pytest.raises(onnx.checker.ValidationError, match="marked single but has an empty"):
        onnx.checker.check_model(str(path), full_check=True)
    assert main(["convert", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "node 'nameless' (Relu): output 0 (Y) is always made" in err[0]
    assert not out.exists()


def test_a_cycle_through_a_node_whose_name_is_not_utf8_is_named(tmp_path, capsys):
    """Fuzz seed 25389: sorting runs before strings are checked, and protobuf gives a name that
    is not UTF-8 as bytes: naming the cycle ended in a TypeError (exit 3)."""
    model = conv_net()
    model.graph.node[1].input[0] = "a"  # relu reads add's output: a cycle
    model.graph.node[2].name = "NAMEMARK"
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString().replace(b"NAMEMARK", b"\xff\xfeMEMARK"))
    assert main(["convert", str(path), "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the graph has a cycle: relu -> \\xff\\xfeMEMARK -> add" in err[0]


def test_a_graph_without_a_name_is_written_with_one(tmp_path, capsys):
    """Fuzz seed 16385: onnxruntime loads a graph whose name is empty, the checker refuses it;
    nothing converted copied it as it was. The output's graph is named main_graph."""
    model = conv_net()
    model.graph.name = ""
    path, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, str(path))
    with pytest.raises(onnx.checker.ValidationError, match="'name' of 'graph' is required"):
        onnx.checker.check_model(str(path))
    for flags in ([], ["--deny", "Conv,MatMul,Relu,Add,Exp,Softmax"]):  # the latter: nothing
        assert main(["convert", str(path), "-o", str(out), *flags]) == 0
        onnx.checker.check_model(str(out), full_check=True)
        assert onnx.load(str(out)).graph.name == "main_graph"
    capsys.readouterr()


def test_an_ir_version_before_opset_import_is_written_as_one_with_it(tmp_path, capsys):
    """Fuzz seed 40012: IR version 2 with an opset_import (which IR 3 brought): the checker
    refuses it; nothing converted copied it as it was. The output says IR 3 or later."""
    model = conv_net()
    model.ir_version = 2
    path, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, str(path))
    with pytest.raises(onnx.checker.ValidationError, match="IR version < 3"):
        onnx.checker.check_model(str(path))
    for flags in ([], ["--deny", "Conv,MatMul,Relu,Add,Exp,Softmax"]):  # the latter: nothing
        assert main(["convert", str(path), "-o", str(out), *flags]) == 0
        onnx.checker.check_model(str(out), full_check=True)
        assert onnx.load(str(out)).ir_version >= 3
    capsys.readouterr()
