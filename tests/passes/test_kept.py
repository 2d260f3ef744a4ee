"""The kept pass on small graphs: in a model that already computes in a low type, its float32
ops stay float32 (rule kept) with a reason naming the Casts around them; a model with no low
op, and a node an allow_names rule names, are decided as always."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import convert, model, weight

F16 = TensorProto.FLOAT16


def test_a_float32_branch_beside_a_float16_one_is_kept():
    """x16 -> MatMul (float16) -> y16 and x -> MatMul (float32) -> Relu -> y: no Cast joins
    them; the float32 branch is the model's decision all the same."""
    w16 = numpy_helper.from_array(np.full((4, 4), 0.5, np.float16), "w16")
    proto = model(
        [
            helper.make_node("MatMul", ["x16", "w16"], ["y16"], name="low"),
            helper.make_node("MatMul", ["x", "w"], ["h"], name="wide"),
            helper.make_node("Relu", ["h"], ["y"], name="relu"),
        ],
        inputs=("x16", "x"),
        outputs=("y16", "y"),
        initializers=[w16, weight("w")],
        input_types={"x16": F16},
        output_types={"y16": F16},
    )
    _, plan = convert(proto)
    assert plan.nodes["low"].rule == "already_low"
    for name in ("wide", "relu"):
        decision = plan.nodes[name]
        assert (decision.precision, decision.rule) == ("float32", "kept")
        assert decision.reason.startswith("float32 in an input model that already computes in")
    assert plan.summary()["casts_inserted"] == 0 and not plan.weights
    _, allowed = convert(proto, allow_names=["wide"])
    assert allowed.nodes["wide"].precision == "float16" and allowed.nodes["relu"].rule == "kept"


def test_a_float32_model_that_stores_a_weight_low_is_decided_as_always():
    """A float16 weight cast up to float32 before a MatMul: nothing computes low yet."""
    w16 = numpy_helper.from_array(np.full((4, 4), 0.5, np.float16), "w16")
    proto = model(
        [
            helper.make_node("Cast", ["w16"], ["w"], name="widen", to=TensorProto.FLOAT),
            helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
        ],
        initializers=[w16],
    )
    _, plan = convert(proto)
    assert plan.nodes["mm"].precision == "float16" and plan.nodes["mm"].rule == "allow"
    assert not any(d.rule == "kept" for d in plan.nodes.values())
