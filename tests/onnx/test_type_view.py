"""type_view reads each value's type as the bytes protobuf would serialise it to, on a model
nobody here wrote (ONNX's shape inference output of an exported-looking graph)."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from graphamp.onnx.io import type_view


def test_value_types_are_the_serialised_type_protos_and_an_output_wins() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Reshape", ["x", "s"], ["r"]),
        helper.make_node("SequenceConstruct", ["r", "r"], ["seq"]),
        helper.make_node("SequenceAt", ["seq", "i"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        # a value_info entry for the output too: the output's own entry is the one read
        value_info=[helper.make_tensor_value_info("y", TensorProto.DOUBLE, [7])],
    )
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), data_prop=True
    )
    types = type_view.value_types(model)
    expected = {info.name: info.type.SerializeToString() for info in model.graph.value_info}
    expected.update((info.name, info.type.SerializeToString()) for info in model.graph.output)
    assert types == expected
    assert {"s", "r", "seq", "y"} <= types.keys()
    assert onnx.TypeProto.FromString(types["y"]).tensor_type.elem_type == TensorProto.FLOAT
    assert onnx.TypeProto.FromString(types["seq"]).HasField("sequence_type")
