"""The ops ONNX added at opsets 24-28 that a decoder block uses: TensorScatter (the KV-cache
update), Swish and SwiGLU (the MLP's activation) follow their neighbours, so a float16 block
built on them needs no Cast, and its cache stays float16 from past to present."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphamp.onnx


def _block(opset: int, activation: str) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = {
        name: rng.standard_normal(shape).astype(np.float32) * 0.1
        for name, shape in (("wk", (16, 16)), ("wg", (16, 32)), ("wu", (16, 32)), ("wd", (32, 16)))
    }
    nodes = [
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
        helper.make_node(
            "TensorScatter", ["past", "k", "index"], ["present"], name="scatter", axis=-2
        ),
        helper.make_node("Gather", ["present", "first"], ["pooled"], name="pool", axis=1),
        helper.make_node("MatMul", ["pooled", "wg"], ["gate"], name="gate_proj"),
        helper.make_node("MatMul", ["pooled", "wu"], ["up"], name="up_proj"),
    ]
    if activation == "Swish":
        nodes += [
            helper.make_node("Swish", ["gate"], ["act"], name="act"),
            helper.make_node("Mul", ["act", "up"], ["ff"], name="glu"),
        ]
    else:
        nodes += [helper.make_node("SwiGLU", ["gate", "up"], ["ff"], name="act")]
    nodes += [helper.make_node("MatMul", ["ff", "wd"], ["y"], name="down_proj")]
    graph = helper.make_graph(
        nodes,
        "block",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1, 16]),
            helper.make_tensor_value_info("past", TensorProto.FLOAT, [2, 8, 16]),
            helper.make_tensor_value_info("index", TensorProto.INT64, [2]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16]),
            helper.make_tensor_value_info("present", TensorProto.FLOAT, [2, 8, 16]),
        ],
        [numpy_helper.from_array(value, name) for name, value in weights.items()]
        + [numpy_helper.from_array(np.array(0, np.int64), "first")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=11)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("opset", "activation"), [(24, "Swish"), (28, "SwiGLU")])
def test_cache_update_and_activation_follow_their_neighbours(dtype, opset, activation):
    result = graphamp.onnx.convert(_block(opset, activation), dtype=dtype)
    nodes = result.plan.nodes
    assert (nodes["scatter"].precision, nodes["scatter"].rule) == (dtype, "clear")
    assert (nodes["act"].precision, nodes["act"].rule) == (dtype, "infer")
    proto = result.to_proto()
    assert [node.name for node in proto.graph.node if node.op_type == "Cast"] == []
    types = {value.name: value.type.tensor_type.elem_type for value in proto.graph.input}
    low = TensorProto.FLOAT16 if dtype == "float16" else TensorProto.BFLOAT16
    assert types["past"] == low  # the cache pair stays in step: past and present both low


def test_cumprod_stays_float32():
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("CumProd", ["h", "axis"], ["y"], name="cumprod"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [
            numpy_helper.from_array(np.eye(4, dtype=np.float32), "w"),
            numpy_helper.from_array(np.array(1, np.int64), "axis"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)], ir_version=11)
    result = graphamp.onnx.convert(model)
    decision = result.plan.nodes["cumprod"]
    assert (decision.precision, decision.rule) == ("float32", "deny")
