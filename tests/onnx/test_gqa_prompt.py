"""onnxruntime's GroupQueryAttention with no past cache (a prompt-only model): its
present_key/present_value have a type variable of their own (T_CACHE, for a quantised cache),
which onnxruntime types after the query when no past is given. A float16 query beside float32
present outputs is refused on load (graphamp's own check turned it into an internal error), so
the present outputs follow the query there; given a past, they follow the past."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphamp.onnx as gonnx

F32, F16, I64, I32 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.INT32


def gqa_model(past: bool) -> onnx.ModelProto:
    """x -> q/k/v MatMuls -> GroupQueryAttention (4 query heads, 2 kv heads of 16) -> MatMul,
    seqlens_k and total_sequence_length from attention_mask, as onnxruntime-genai writes them."""
    rng = np.random.default_rng(0)

    def weight(name: str, cols: int) -> onnx.TensorProto:
        return numpy_helper.from_array(
            (rng.standard_normal((64, cols)) * 0.1).astype(np.float32), name
        )

    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v_proj"),
        helper.make_node("ReduceSum", ["attention_mask", "one"], ["total"], keepdims=0),
        helper.make_node("Sub", ["total", "one"], ["last"]),
        helper.make_node("Cast", ["last"], ["seqlens_k"], to=I32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "one"], ["length"], axis=0),
        helper.make_node("Cast", ["length"], ["total_length"], to=I32),
        helper.make_node(
            "GroupQueryAttention",
            [
                "q",
                "k",
                "v",
                "past_key" if past else "",
                "past_value" if past else "",
                "seqlens_k",
                "total_length",
            ],
            ["y", "present_key", "present_value"],
            name="attn",
            domain="com.microsoft",
            num_heads=4,
            kv_num_heads=2,
        ),
        helper.make_node("MatMul", ["y", "wo"], ["out"], name="o_proj"),
    ]
    inputs = [
        helper.make_tensor_value_info("x", F32, ["batch", "sequence", 64]),
        helper.make_tensor_value_info("attention_mask", I64, ["batch", "total"]),
    ]
    if past:
        inputs += [
            helper.make_tensor_value_info(name, F32, ["batch", 2, "past", 16])
            for name in ("past_key", "past_value")
        ]
    outputs = [helper.make_tensor_value_info("out", F32, ["batch", "sequence", 64])] + [
        helper.make_tensor_value_info(name, F32, ["batch", 2, "total", 16])
        for name in ("present_key", "present_value")
    ]
    inits = [weight("wq", 64), weight("wk", 32), weight("wv", 32), weight("wo", 64)]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "one"))
    graph = helper.make_graph(nodes, "gqa", inputs, outputs, inits)
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=8,
    )


def output_types(proto: onnx.ModelProto) -> dict[str, int]:
    return {v.name: v.type.tensor_type.elem_type for v in proto.graph.output}


def runs(proto: onnx.ModelProto) -> None:
    """The model loads and runs in onnxruntime's CPU provider (default session and none of
    its graph optimisations), on a prompt of 3 tokens (and a past of 2 where it takes one)."""
    rng = np.random.default_rng(1)
    types = {v.name: v.type.tensor_type.elem_type for v in proto.graph.input}
    float_type = {F32: np.float32, F16: np.float16}
    feeds = {"x": rng.standard_normal((1, 3, 64)), "attention_mask": np.ones((1, 3), np.int64)}
    if "past_key" in types:
        feeds["attention_mask"] = np.ones((1, 5), np.int64)
        feeds["past_key"] = feeds["past_value"] = rng.standard_normal((1, 2, 2, 16))
    feeds = {
        name: value.astype(float_type[types[name]]) if types[name] in float_type else value
        for name, value in feeds.items()
    }
    for level in (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    ):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        session = ort.InferenceSession(
            proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        for value in session.run(None, feeds):
            assert np.isfinite(np.asarray(value, np.float32)).all()


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("keep_io_types", [False, True])
def test_prompt_gqa_present_follows_the_query(target, keep_io_types):
    out = gonnx.convert(gqa_model(past=False), target=target, keep_io_types=keep_io_types)
    proto = out.to_proto()
    attention = next(n for n in proto.graph.node if n.op_type == "GroupQueryAttention")
    assert out.plan.nodes[attention.name].precision == "float16"
    types = output_types(proto)
    want = F32 if keep_io_types else F16
    assert types["present_key"] == types["present_value"] == want, types
    runs(proto)


@pytest.mark.parametrize("keep_io_types", [False, True])
def test_gqa_with_past_present_follows_the_past(keep_io_types):
    proto = gonnx.convert(
        gqa_model(past=True), target="cpu", keep_io_types=keep_io_types
    ).to_proto()
    inputs = {v.name: v.type.tensor_type.elem_type for v in proto.graph.input}
    types = output_types(proto)
    assert types["present_key"] == inputs["past_key"], (types, inputs)
    runs(proto)
