"""Painting rules (TensorFlow auto_mixed_precision semantics) on tiny chains and diamonds:
the policy's ``spread = "tensorflow"`` (ONNX's default is ``cost``, tests/passes/test_cost.py).

Naming in the chains: MatMul = allow, Sigmoid/Add = infer, Relu = clear, Exp = deny,
TopK-free unlisted op: Sin.
"""

from __future__ import annotations

from onnx import helper

from tests import helpers
from tests.helpers import chain, model, precisions, weight

LOW, F32 = "float16", "float32"


def convert(proto, **policy):
    """helpers.convert under TensorFlow's colouring."""
    return helpers.convert(proto, spread="tensorflow", **policy)


def paint(ops: list[str], **policy) -> list[str]:
    _, plan = convert(chain(ops), **policy)
    result = precisions(plan)
    return [result[f"{op.lower()}{i}"] for i, op in enumerate(ops)]


def test_no_allow_ops_leaves_everything_float32():
    assert paint(["Exp", "Relu", "Sqrt", "Relu", "Identity"]) == [F32] * 5


def test_deny_spreads_only_along_paths_ending_at_deny_or_infer():
    # TF's comment example: deny->infer->clear->infer->clear->allow->infer gives
    # deny,deny,deny,deny,clear,allow,infer; then the clear joins its allow neighbour.
    ops = ["Exp", "Sigmoid", "Relu", "Sigmoid", "Relu", "MatMul", "Sigmoid"]
    assert paint(ops) == [F32, F32, F32, F32, LOW, LOW, F32]
    _, plan = convert(chain(ops))
    assert plan.nodes["sigmoid3"].rule == "deny_spread"
    assert plan.nodes["sigmoid3"].via == "exp0"


def test_tf_simple_case():
    # TF AutoMixedPrecisionTest.Simple: exp, relu1, Sqrt f32; relu2, mm, relu3 low;
    # Log, relu4, unlisted op, relu5 f32.
    ops = ["Exp", "Relu", "Sqrt", "Relu", "MatMul", "Relu", "Log", "Relu", "Sin", "Relu"]
    assert paint(ops) == [F32, F32, F32, LOW, LOW, LOW, F32, F32, F32, F32]


def test_infer_between_allow_ops_is_low():
    assert paint(["MatMul", "Sigmoid", "MatMul"]) == [LOW, LOW, LOW]
    assert paint(["MatMul", "Add", "Relu", "Tanh", "MatMul"]) == [LOW] * 5


def test_infer_after_last_allow_stays_float32():
    assert paint(["MatMul", "Sigmoid"]) == [LOW, F32]
    assert paint(["Sigmoid", "MatMul"]) == [F32, LOW]


def test_deny_between_allow_ops_blocks_the_sandwich():
    # The first Sigmoid is downstream of an allow op but Exp blocks the path to the next one;
    # the second is denied (deny spreads from Exp to it).
    assert paint(["MatMul", "Sigmoid", "Exp", "Sigmoid", "MatMul"]) == [LOW, F32, F32, F32, LOW]


def test_clear_chain_joins_in_both_directions():
    # TF BidirectionalClearChain: relu1 -> mm, relu1 and relu2 share an input, ...
    nodes = [
        helper.make_node("Relu", ["x"], ["r1"], name="relu1"),
        helper.make_node("Relu", ["x"], ["r2"], name="relu2"),
        helper.make_node("MatMul", ["r1", "w"], ["m"], name="mm"),
        helper.make_node("Relu", ["r2"], ["r4"], name="relu4"),
        helper.make_node("Concat", ["r1", "r2"], ["c"], name="concat", axis=0),
    ]
    proto = model(nodes, outputs=("m", "r4", "c"), initializers=[weight("w")])
    _, plan = convert(proto)
    assert {n: precisions(plan)[n] for n in ("relu1", "relu2", "mm", "relu4", "concat")} == {
        "relu1": LOW,
        "relu2": LOW,
        "mm": LOW,
        "relu4": LOW,
        "concat": LOW,
    }
    assert plan.nodes["relu2"].via is not None


def test_name_rule_denies_and_spreads_like_a_deny_op():
    # Deny spreads forward only: the Relu before the denied MatMul joins the first MatMul.
    assert paint(["MatMul", "Relu", "MatMul"], deny_names=["matmul2"]) == [LOW, LOW, F32]
    assert paint(["MatMul", "Relu", "MatMul"], deny_names=["matmul*"]) == [F32, F32, F32]
    # From a denied node, deny does not enter a clear op whose path leads to an allow op.
    assert paint(["MatMul", "Relu", "MatMul", "Relu"], deny_names=["matmul0"]) == [
        F32,
        LOW,
        LOW,
        LOW,
    ]


def test_deny_tensor_keeps_readers_and_writers_float32():
    _, plan = convert(chain(["MatMul", "Relu", "MatMul"]), deny_tensors=["t0"])
    p = precisions(plan)
    assert p["matmul0"] == F32 and p["relu1"] == F32  # matmul0 writes t0, relu1 reads it
    assert p["matmul2"] == LOW
    assert plan.nodes["matmul0"].rule == "deny_tensor"


def test_moving_an_op_between_lists():
    assert paint(["MatMul", "Exp", "MatMul"], allow=["Exp"]) == [LOW, LOW, LOW]
    assert paint(["MatMul", "Relu", "MatMul"], deny=["MatMul"]) == [F32, F32, F32]
    assert paint(["MatMul", "Sin", "MatMul"], clear=["Sin"]) == [LOW, LOW, LOW]


def test_every_decision_has_a_reason():
    _, plan = convert(chain(["Exp", "Sigmoid", "MatMul", "Relu", "Sin"]))
    for decision in plan.nodes.values():
        assert decision.reason and decision.rule
