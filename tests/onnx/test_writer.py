"""The ONNX writer's edits on a model written for them (output Casts, Casts already in the
model, weights in Constant nodes, an unnamed node, an input read twice, a denied op): a model
the checker accepts, each value in the type the plan gives it; the input never changed; a
converted proto saved whole or not at all."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphamp import engine
from graphamp.errors import GraphampError
from graphamp.onnx.dialect.plugin import OnnxDialect
from graphamp.policy.policy import Policy


def converted(proto: onnx.ModelProto, **policy: object) -> engine.Conversion:
    return engine.convert(proto, Policy.create(where="test", **policy), dialect=OnnxDialect())


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
def test_edits_the_node_cases_lack_give_a_model_the_checker_accepts(
    policy: dict[str, object],
) -> None:
    conversion = converted(edits_model(), **policy)
    out = conversion.model
    onnx.checker.check_model(out, full_check=True)
    # every value keeps the type the plan gives it: an output Cast where the output stays
    # float32, the weights stored in the type of the op that reads them
    types = {v.name: v.type.tensor_type.elem_type for v in out.graph.value_info}
    types.update((v.name, v.type.tensor_type.elem_type) for v in out.graph.output)
    low = TensorProto.BFLOAT16 if policy.get("dtype") == "bfloat16" else TensorProto.FLOAT16
    nodes = {node.name: node for node in out.graph.node}
    checked = 0
    for name, decision in conversion.plan.nodes.items():
        node = nodes.get(name)  # (a Cast of the model made redundant is gone)
        if node is None or node.op_type == "Cast" or node.output[0] not in types:
            continue
        if decision.precision not in ("float16", "bfloat16", "float32"):
            continue  # a Constant: its value is a weight, stored as its readers need
        expected = low if decision.precision in ("float16", "bfloat16") else TensorProto.FLOAT
        assert types[node.output[0]] == expected, name
        checked += 1
    assert checked >= 5
    if policy.get("keep_io_types"):
        assert {v.name: v.type.tensor_type.elem_type for v in out.graph.output} == {
            "y": TensorProto.FLOAT,
            "z": TensorProto.FLOAT,
        }


def test_a_constant_given_as_value_float_converts_to_one_value_attribute() -> None:
    """(A Constant with "value" beside "value_float" has two values, which ONNX refuses.)"""
    proto = converted(edits_model(), allow=["Mul"]).model
    node = next(n for n in proto.graph.node if n.output[0] == "cs")
    assert [a.name for a in node.attribute] == ["value"]
    assert node.attribute[0].t.data_type == onnx.TensorProto.FLOAT16


def test_the_input_proto_is_not_changed() -> None:
    proto = edits_model()
    before = proto.SerializeToString()
    converted(proto, keep_io_types=True)
    assert proto.SerializeToString() == before


def test_a_converted_proto_is_saved_whole_or_not_at_all(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import errno
    from pathlib import Path

    from graphamp.onnx.io import files

    out = converted(edits_model()).model
    target = tmp_path / "out.onnx"
    files.save(out, target)
    assert onnx.load(str(target)) == out

    def full_disk(self, data):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    with pytest.raises(GraphampError, match=r"no space left on device.*nothing was written"):
        files.save(out, tmp_path / "second.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]
