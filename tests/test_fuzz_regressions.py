"""Engine bugs the fuzz harness (tools/fuzz.py) found, each as the smallest graph that shows
it: converting must be a fixed point, valid, and add no Cast that one already in the model
(or another inserted one) makes redundant."""

from __future__ import annotations

from onnx import TensorProto, helper

from tests.helpers import assert_valid, convert, model, weight


def assert_fixed_point(proto, **policy) -> None:  # type: ignore[no-untyped-def]
    first, _ = convert(proto, **policy)
    again, _ = convert(first, **policy)
    assert again.SerializeToString() == first.SerializeToString()
    assert_valid(first)


def test_a_dead_cast_chain_in_the_model_is_left_as_it_is():
    """x -> Cast(int32) -> Cast(float32), read by nothing: the first conversion removed the
    outer Cast only, so the second removed the inner one (fuzz seed 80)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
        helper.make_node("Cast", ["x"], ["as_int"], name="down", to=TensorProto.INT32),
        helper.make_node("Cast", ["as_int"], ["back"], name="up", to=TensorProto.FLOAT),
    ]
    proto = model(nodes, initializers=[weight("w")])
    assert_fixed_point(proto)
    first, _ = convert(proto)
    assert {n.name for n in first.graph.node} >= {"down", "up"}
