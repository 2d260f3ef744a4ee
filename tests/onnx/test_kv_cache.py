"""A decoder's KV cache: each present output has its past input's type, with and without
keep_io_types, so a generation loop can feed present back as past (and float16 halves the
cache's memory)."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from tests.helpers import assert_valid, convert, model, weight

F16, F32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT


def decoder(present_op: str = "Concat") -> onnx.ModelProto:
    """k = x @ wk; present = Concat(past, k) (or Exp(k), a float32 op, with past read only by
    a MatMul); scores = x @ present^T."""
    nodes = [helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj")]
    if present_op == "Concat":
        nodes.append(helper.make_node("Concat", ["past_key_0", "k"], ["present_key_0"], axis=0))
        nodes[-1].name = "cache"
        scores_input = "present_key_0"
    else:
        nodes.append(helper.make_node("Exp", ["k"], ["present_key_0"], name="cache"))
        nodes.append(helper.make_node("MatMul", ["past_key_0", "wk"], ["p"], name="past_proj"))
        scores_input = "p"
    nodes += [
        helper.make_node("Transpose", [scores_input], ["kt"], name="t"),
        helper.make_node("MatMul", ["x", "kt"], ["scores"], name="scores_mm"),
    ]
    return model(
        nodes,
        inputs=("x", "past_key_0"),
        outputs=("scores", "present_key_0"),
        initializers=[weight("wk")],
    )


def io_types(proto: onnx.ModelProto) -> dict[str, int]:
    return {v.name: v.type.tensor_type.elem_type for v in [*proto.graph.input, *proto.graph.output]}


@pytest.mark.parametrize("present_op", ["Concat", "Exp"])
@pytest.mark.parametrize("keep_io_types", [False, True])
def test_present_has_the_type_of_its_past(present_op, keep_io_types):
    out, _ = convert(decoder(present_op), keep_io_types=keep_io_types)
    assert_valid(out)
    types = io_types(out)
    assert types["present_key_0"] == types["past_key_0"], types
    if keep_io_types:
        assert types["past_key_0"] == F32
    elif present_op == "Concat":
        assert types["past_key_0"] == F16, "float16 halves the cache when nothing needs float32"
