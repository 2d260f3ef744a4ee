"""Bodies as scopes of the one neutral graph (DESIGN.md, "Scopes"): a body's nodes decided by
the same passes, an If output one type in both branches, a loop-carried value one type at
entry, in the body and at exit. OpGraphs built in code: no dialect involved."""

from __future__ import annotations

import dataclasses

from graphamp.core.graph import Body, BodyKind, NodeKind, OpGraph, OpNode, TensorInfo
from graphamp.passes import PassContext, PassManager
from graphamp.passes.pipeline import MODEL
from graphamp.policy.policy import Policy
from tests.opgraphs import GraphBuilder

FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})


def _boundary(graph: OpGraph, name: str, inputs, outputs, *, back=(), body="") -> None:
    node = OpNode(
        name=name,
        op="Loop.carried" if back else "If.output",
        inputs=list(inputs),
        outputs=list(outputs),
        kind=NodeKind.BOUNDARY,
        follow_inputs=frozenset(range(len(inputs))),
        follow_outputs=frozenset(range(len(outputs))),
        allowed_types=FLOATS,
        compute_type="float32",
        back_inputs=frozenset(back),
        body=body,
        params={"boundary": f"{name}: one value across the boundary"},
    )
    graph.add_node(node)


def loop_graph(*, tail: str = "Tanh", entry: str = "float32") -> OpGraph:
    """x -> Loop { h -> MatMul(h, w) -> <tail> -> next h } -> y: an RNN's hidden state."""
    b = GraphBuilder()
    graph = b.graph
    x = b.input("x", entry)
    w = b.weight("w")
    graph.add_node(
        OpNode("loop", "Loop", [], [], kind=NodeKind.CONTROL_FLOW, bodies=("loop/body",))
    )
    graph.add_body(Body("loop/body", BodyKind.LOOP, owner="loop", inputs=["loop/body/h"]))
    for name, body in (("loop/body/h", "loop/body"), ("y", ""), ("loop/body/next", "loop/body")):
        graph.add_tensor(TensorInfo(name, "float32", shape=(4, 4), body=body))
    _boundary(graph, "loop/carried:h", [x, "loop/body/next"], ["loop/body/h", "y"], back=[1])
    mm = b.op("loop/body/mm", "MatMul", ["loop/body/h", w])
    graph.nodes[mm].body = "loop/body"
    graph.tensors[mm].body = "loop/body"
    tail_node = OpNode(
        "loop/body/tail",
        tail,
        [mm],
        ["loop/body/next"],
        follow_inputs=frozenset({0}),
        follow_outputs=frozenset({0}),
        allowed_types=FLOATS,
        compute_type="float32",
        body="loop/body",
    )
    graph.add_node(tail_node)
    return b.output("y")


def run(graph: OpGraph, policy: Policy | None = None) -> PassContext:
    context = PassContext(graph, policy or Policy.create("float16"))
    return PassManager(MODEL, check=True).run(context)


def precisions(context: PassContext) -> dict[str, str]:
    return {name: str(d.precision) for name, d in context.decisions.items()}


def test_a_loop_carried_value_is_decided_with_its_body_through_the_back_edge():
    context = run(loop_graph())
    # Tanh is between the MatMul and the MatMul of the next iteration: low, and so is the
    # carried value; no Cast runs per iteration (the graph input itself takes float16).
    assert precisions(context) == {
        "loop": "none",
        "loop/carried:h": "float16",
        "loop/body/mm": "float16",
        "loop/body/tail": "float16",
    }
    script = context.script
    assert script.casts == []
    assert script.retype["x"] == script.retype["loop/body/h"] == script.retype["y"] == "float16"
    # kept in float32 at the graph's edge, the one Cast is at the loop's entry
    kept = run(loop_graph(), Policy.create("float16", keep_io_types=True)).script
    assert [(c.tensor, c.dst) for c in kept.casts] == [("x", "float16")]
    assert [(c.output, c.dst) for c in kept.output_casts] == [("y", "float32")]


def test_a_deny_op_ending_the_body_costs_one_cast_per_iteration_as_inline():
    tensorflow = dataclasses.replace(Policy.create("float16"), spread="tensorflow")
    context = run(loop_graph(tail="Exp"), tensorflow)
    decided = precisions(context)
    assert decided["loop/body/tail"] == "float32"
    assert decided["loop/carried:h"] == decided["loop/body/mm"] == "float16"
    # the next iteration's MatMul needs Exp's float32 result low: the body needs that Cast,
    # as the same ops unrolled would
    casts = {(c.tensor, c.dst) for c in context.script.casts}
    assert casts == {("loop/body/mm", "float32"), ("loop/body/next", "float16")}
    # the cost pass finds the same two Casts per iteration with the carried value float32
    # (h into the MatMul, its result out to Exp): a tie, which stays float32
    context = run(loop_graph(tail="Exp"))
    assert precisions(context)["loop/carried:h"] == "float32"
    casts = {(c.tensor, c.dst) for c in context.script.casts}
    assert casts == {("loop/body/h", "float16"), ("loop/body/mm", "float32")}


def test_promote_decides_a_loop_carried_value_to_a_fixed_point():
    autocast = dataclasses.replace(Policy.create("float16"), spread="autocast")
    # low at entry, but the body's result is float32 (exp runs float32 under autocast): the
    # carried value is float32 throughout, found on the second walk
    context = run(loop_graph(tail="Exp", entry="float16"), autocast)
    assert precisions(context)["loop/carried:h"] == "float32"
    assert "next value 'loop/body/next' is float32" in context.decisions["loop/carried:h"].reason
    # a body that keeps it low: low throughout
    context = run(loop_graph(tail="Relu", entry="float16"), autocast)
    assert precisions(context)["loop/carried:h"] == "float16"
    assert precisions(context)["loop/body/tail"] == "float16"
    # float32 at entry, but every op reading it in the body computes low and the body gives
    # it low: low throughout, the one Cast before the loop instead of two per iteration
    # (promote's rule 5; autocast itself refuses such a loop: its body returns another type
    # than it was given)
    graph = loop_graph(tail="Relu")
    context = run(graph, dataclasses.replace(autocast, keep_io_types=True))
    assert precisions(context)["loop/carried:h"] == "float16"
    assert "one Cast before the loop" in context.decisions["loop/carried:h"].reason
    assert [(c.tensor, c.dst) for c in context.script.casts] == [("x", "float16")]
    # one more reader inside that computes float32 (an Exp of it) keeps it float32
    graph = loop_graph(tail="Relu")
    graph.add_tensor(TensorInfo("loop/body/side", "float32", shape=(4, 4), body="loop/body"))
    side = OpNode(
        "loop/body/side",
        "Exp",
        ["loop/body/h"],
        ["loop/body/side"],
        follow_inputs=frozenset({0}),
        follow_outputs=frozenset({0}),
        allowed_types=FLOATS,
        compute_type="float32",
        body="loop/body",
    )
    graph.add_node(side)
    context = run(graph, autocast)
    assert precisions(context)["loop/carried:h"] == "float32"
    assert precisions(context)["loop/body/tail"] == "float16"


def test_an_if_output_has_one_type_in_both_branches():
    # then: MatMul (low); else: Relu(x) (clear); after the If, another MatMul reads the output.
    b = GraphBuilder()
    graph = b.graph
    x = b.input("x")
    w = b.weight("w")
    graph.add_node(
        OpNode(
            "if",
            "If",
            [],
            [],
            kind=NodeKind.CONTROL_FLOW,
            bodies=("if/then_branch", "if/else_branch"),
        )
    )
    for path in ("if/then_branch", "if/else_branch"):
        graph.add_body(Body(path, BodyKind.BRANCH, owner="if"))
    then_out = b.op("if/then_branch/mm", "MatMul", [x, w])
    else_out = b.op("if/else_branch/neg", "Neg", [x])
    graph.nodes[then_out].body, graph.nodes[else_out].body = "if/then_branch", "if/else_branch"
    graph.add_tensor(TensorInfo("out", "float32", shape=(4, 4)))
    _boundary(graph, "if/output:out", [then_out, else_out], ["out"])
    b.op("after", "MatMul", ["out", w])
    context = run(b.output("after"))
    decided = precisions(context)
    assert decided["if/output:out"] == "float16"
    assert decided["if/else_branch/neg"] == "float16"  # Neg is infer, between MatMuls
    assert context.script.casts == [] or all(c.tensor == "x" for c in context.script.casts)
