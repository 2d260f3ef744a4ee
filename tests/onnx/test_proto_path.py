"""The direct path (a ModelProto read and patched without onnx_ir) gives what the onnx_ir path
gives: the same OpGraph, the same plan and the same output model, on graphs nobody here wrote
(ONNX's node test cases, in float16 and bfloat16, with and without keep_io_types) and on
models with the edits the node cases lack (output Casts, Casts already in the model, weights
in Constant nodes)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

from graphamp import engine
from graphamp.core.graph import OpGraph
from graphamp.errors import GraphampError
from graphamp.onnx import infile, proto_reader
from graphamp.onnx.dialect import OnnxDialect
from graphamp.policy.policy import Policy
from tests.onnx.node_cases import float_cases

NODE_FIELDS = ("op", "inputs", "outputs", "kind", "domain", "follow_inputs", "follow_outputs",
               "any_type_inputs", "allowed_types", "schema_source", "no_kernel",
               "compute_type", "cast_to", "flops", "implicit_inputs")  # fmt: skip


def both(proto: onnx.ModelProto, **policy: object) -> tuple[engine.Conversion, ...]:
    made = []
    for direct in (False, True):
        conversion = engine.convert(
            proto, Policy.create(where="test", **policy), dialect=OnnxDialect(direct=direct)
        )
        made.append(conversion)
    return tuple(made)


def graph_facts(graph: OpGraph) -> tuple[object, object]:
    nodes = {n.name: tuple(getattr(n, f) for f in NODE_FIELDS) for n in graph}
    tensors = {
        name: (t.dtype, t.shape, t.is_graph_input, t.is_graph_output, t.is_constant, t.producer)
        for name, t in graph.tensors.items()
        if name
    }
    return nodes, tensors


def plan_facts(conversion: engine.Conversion) -> dict[str, object]:
    data = json.loads(conversion.plan.to_json())
    data.pop("passes", None)  # timings
    return data


def model_facts(proto: onnx.ModelProto) -> dict[str, object]:
    graph = proto.graph
    return {
        "nodes": [
            (
                n.name,
                n.op_type,
                n.domain,
                list(n.input),
                list(n.output),
                sorted(a.SerializeToString(deterministic=True) for a in n.attribute),
            )
            for n in graph.node
        ],
        "initializers": [
            (i.name, i.data_type, list(i.dims), numpy_helper.to_array(i).tobytes())
            for i in graph.initializer
        ],
        "inputs": [(v.name, v.type.tensor_type.elem_type) for v in graph.input],
        "outputs": [(v.name, v.type.tensor_type.elem_type) for v in graph.output],
        "opsets": sorted((o.domain, o.version) for o in proto.opset_import),
    }


def value_types(proto: onnx.ModelProto) -> dict[str, int]:
    return {v.name: v.type.tensor_type.elem_type for v in proto.graph.value_info}


def assert_same(proto: onnx.ModelProto, **policy: object) -> None:
    try:
        through_ir, direct = both(proto, **policy)
    except GraphampError as error:  # refused: the direct path refuses it the same way
        with pytest.raises(GraphampError) as raised:
            engine.convert(
                proto, Policy.create(where="test", **policy), dialect=OnnxDialect(direct=True)
            )
        assert str(raised.value) == str(error)
        return
    assert graph_facts(through_ir.graph) == graph_facts(direct.graph)
    assert plan_facts(through_ir) == plan_facts(direct)
    expected = ir.to_proto(through_ir.model)
    assert isinstance(direct.model, onnx.ModelProto)
    assert model_facts(expected) == model_facts(direct.model)
    # Every value onnx_ir types, the direct path types alike (it may type fewer: onnx_ir also
    # writes initializers' types); a changed type is always written.
    written = value_types(direct.model)
    for name, elem_type in value_types(expected).items():
        assert written.get(name, elem_type) == elem_type, name


CASES = [case for case in float_cases() if proto_reader.suits(case.model)]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_node_case_converts_alike_on_both_paths(case) -> None:  # type: ignore[no-untyped-def]
    for dtype in ("float16", "bfloat16"):
        assert_same(case.model, dtype=dtype)
    assert_same(case.model, keep_io_types=True)


def test_most_node_cases_take_the_direct_path() -> None:
    assert len(CASES) > 0.8 * len(float_cases())


def weight(name: str, shape: tuple[int, ...] = (4, 4), scale: float = 0.5) -> onnx.TensorProto:
    values = np.random.default_rng(len(name)).standard_normal(shape) * scale
    return numpy_helper.from_array(values.astype(np.float32), name)


def edits_model() -> onnx.ModelProto:
    """Output Casts (keep_io_types), a model Cast made redundant, a weight in a Constant node
    and one in value_float, an unnamed node, two readers of one graph input, a denied op."""
    nodes = [
        helper.make_node("Constant", [], ["cw"], value=weight("cw")),
        helper.make_node("Constant", [], ["cs"], value_float=0.5),
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Cast", ["m"], ["m32"], name="c32", to=onnx.TensorProto.FLOAT),
        helper.make_node("MatMul", ["m32", "cw"], ["m2"]),
        helper.make_node("Mul", ["m2", "cs"], ["s"], name="scale"),
        helper.make_node("Exp", ["s"], ["e"], name="exp"),
        helper.make_node("Add", ["e", "x"], ["y"], name="add"),
        helper.make_node("Relu", ["y"], ["z"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "edits",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 4])],
        [
            helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 4]),
            helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [4, 4]),
        ],
        [weight("w")],
        value_info=[helper.make_tensor_value_info("m", onnx.TensorProto.FLOAT, [4, 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("policy", [{}, {"keep_io_types": True}, {"dtype": "bfloat16"},
                                    {"deny": ["Add"]}, {"allow": ["Exp"]},
                                    {"allow": ["Mul"]}])  # fmt: skip
def test_edits_the_node_cases_lack_apply_alike(policy: dict[str, object]) -> None:
    assert_same(edits_model(), **policy)
    converted = both(edits_model(), **policy)[1].model
    onnx.checker.check_model(converted, full_check=True)


def test_a_constant_given_as_value_float_converts_to_one_value_attribute() -> None:
    """(Both writers once added "value" beside "value_float": a Constant with two values,
    which ONNX refuses.)"""
    for conversion in both(edits_model(), allow=["Mul"]):
        model = conversion.model
        proto = model if isinstance(model, onnx.ModelProto) else ir.to_proto(model)
        node = next(n for n in proto.graph.node if n.output[0] == "cs")
        assert [a.name for a in node.attribute] == ["value"]
        assert node.attribute[0].t.data_type == onnx.TensorProto.FLOAT16


def test_the_input_proto_is_not_changed() -> None:
    proto = edits_model()
    before = proto.SerializeToString()
    both(proto, keep_io_types=True)
    assert proto.SerializeToString() == before


def test_models_that_need_onnx_ir_do_not_take_the_direct_path() -> None:
    proto = edits_model()
    assert proto_reader.suits(proto)
    passthrough = onnx.ModelProto()
    passthrough.CopyFrom(proto)
    passthrough.graph.output.append(passthrough.graph.input[0])
    assert not proto_reader.suits(passthrough)


@pytest.mark.parametrize("name", ["bert", "gpt", "mnist"])
def test_a_model_file_converts_alike_on_both_paths(zoo_model, name: str) -> None:  # type: ignore[no-untyped-def]
    path = zoo_model(name)
    through_ir, direct = both(path)
    assert isinstance(through_ir.model, ir.Model)
    # A file's weights over 4 KiB stay in it until written (graphamp/onnx/infile.py).
    streamed = infile.read(path).tensors  # type: ignore[union-attr]
    assert isinstance(direct.model, infile.StreamedModel if streamed else onnx.ModelProto)
    converted = direct.model.to_proto() if streamed else direct.model
    assert plan_facts(through_ir) == plan_facts(direct)
    assert model_facts(ir.to_proto(through_ir.model)) == model_facts(converted)


def test_a_direct_conversion_is_saved_whole_or_not_at_all(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import errno
    from pathlib import Path

    from graphamp.onnx import files

    converted = both(edits_model())[1].model
    target = tmp_path / "out.onnx"
    files.save(converted, target)
    assert onnx.load(str(target)) == converted

    def full_disk(self, data):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    with pytest.raises(GraphampError, match=r"no space left on device.*nothing was written"):
        files.save(converted, tmp_path / "second.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]
