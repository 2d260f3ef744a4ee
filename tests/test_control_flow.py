"""If/Loop/Scan: kept float32 with their bodies untouched, and never an invalid model, even
when a body reads an outer value that the conversion turned into float16."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from tests.helpers import F32, assert_valid, convert, model, run, weight


def if_model():
    # m = MatMul(x, w) (low); If(cond) { then: Relu(m) + m read from the outer scope;
    # else: Neg(m) }; the If output feeds another MatMul.
    then_body = helper.make_graph(
        [helper.make_node("Relu", ["m"], ["then_out"], name="then_relu")],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", F32, [4, 4])],
    )
    else_body = helper.make_graph(
        [helper.make_node("Neg", ["m"], ["else_out"], name="else_neg")],
        "else",
        [],
        [helper.make_tensor_value_info("else_out", F32, [4, 4])],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node(
            "If", ["cond"], ["branch"], name="if", then_branch=then_body, else_branch=else_body
        ),
        helper.make_node("MatMul", ["branch", "w"], ["y"], name="mm2"),
    ]
    proto = model(
        nodes,
        inputs=("x", "cond"),
        initializers=[weight("w")],
        input_types={"cond": TensorProto.BOOL},
    )
    proto.graph.input[1].type.tensor_type.shape.ClearField("dim")
    return proto


def test_if_body_reading_a_converted_outer_value_stays_valid():
    proto = if_model()
    out, plan = convert(proto)
    assert plan.nodes["if"].precision == "float32"
    assert plan.nodes["if"].rule == "control_flow"
    assert plan.nodes["mm"].precision == "float16"
    # The body now reads a float32 cast of m, not the float16 m.
    cast = next(c for c in plan.casts if c.tensor == "m")
    assert cast.dst == "float32" and cast.consumers == ["if"]
    if_node = next(n for n in out.graph.node if n.op_type == "If")
    then_branch = next(a.g for a in if_node.attribute if a.name == "then_branch")
    assert then_branch.node[0].input[0] == cast.output
    assert_valid(out)
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    for cond in (True, False):
        feeds = {"x": x, "cond": np.array(cond)}
        expected = run(proto, feeds)[0]
        actual = run(out, feeds)[0].astype(np.float32)
        assert np.abs(actual - expected).max() <= 1e-2 * np.abs(expected).max()
