"""promote: autocast's semantics, for policies whose lists say ``spread = "autocast"``.

Under ``torch.autocast`` an op in the low-precision list runs low, an op in the fp32 list runs
float32, and every other op runs in whatever type its inputs have: a binary op reading float32
and bfloat16 computes in float32 (type promotion), so a residual stream that starts float32
stays float32 while the matrix products run low. TensorFlow's rules (the paint pass) would pull
such an add into low precision instead. Rules, walking the graph in order and tracking the type
each value has after the decisions so far:

1. Allow-class nodes run in low precision; their computation-type outputs are low.
2. Infer- and clear-class nodes (autocast's promote list and the ops it leaves alone) compute
   in the promoted type of their computation-type inputs: low when every one is low, float32
   when any is float32. A 0-d tensor does not promote a tensor with dimensions (PyTorch's
   rule for scalars), nor does an empty one (a size-0 dimension: the first, lazily made
   value of a KV cache, made in the model's float32 where eager autocast makes it low), unless
   all inputs are such. A norm's weight and bias do not promote either: PyTorch's
   layer_norm, group_norm and rms_norm take a low input with float32 parameters and write
   the input's type (the casts pass leaves those parameters float32, as autocast does).
3. Every other node keeps the decision classify gave it; its outputs keep their types (a Cast
   already in the model yields its target).
4. A loop-carried value (a boundary node with a back input: what the body produced in the
   previous iteration) is one value at entry, in the body and at exit. The walk first takes
   the body's result to have the type the value has at entry; where the body then gives it
   float32, the value is float32 throughout, and the walk runs again: a fixed point, reached
   after at most one more walk per such value.
5. A value entering a body that runs once per iteration (a loop-carried value, an input a
   loop slices) that rule 2 left float32 enters low where every op reading it inside the loop
   computes low and, for a loop-carried value, the body gives its next value low: the one Cast
   then runs before the loop instead of once per iteration, and the values read are the same
   (the low next value widened and narrowed again is exact). The walk runs again with it low;
   lowering a value only lowers what reads it, so this too reaches a fixed point.

Every node decided here records the input its type came from (``via``).
"""

from __future__ import annotations

import logging

from graphamp.core.dtypes import FLOAT_TYPES, LOW_TYPES
from graphamp.core.graph import BodyKind, NodeKind, OpGraph, OpNode
from graphamp.core.vocab import Precision, Rule
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.plans.records import NodeDecision

log = logging.getLogger(__name__)

_FOLLOWERS = (Rule.INFER, Rule.CLEAR)


class PromotePass(Pass):
    """Decide infer and clear nodes by type promotion (see the module docstring)."""

    name = "promote"
    requires = frozenset({Fact.CLASSIFIED})
    gives = frozenset({Fact.DECIDED})

    def run(self, context: PassContext) -> PassResult:
        context.decisions = promote(context.graph, context.decisions, context.policy.dtype)
        return PassResult(modified=False)


def promote(graph: OpGraph, classes: dict[str, NodeDecision], low: str) -> dict[str, NodeDecision]:
    """Final precision of every node; ``classes`` comes from the classify pass."""
    carried = [node for node in graph if node.back_inputs]
    entering = [node for node in graph if _enters_a_loop(graph, node)]
    widened: dict[str, str] = {}  # loop-carried boundary -> the body's float32 result
    narrowed: set[str] = set()  # boundaries entering a loop low (rule 5)
    while True:
        decisions, has = _walk(graph, classes, low, widened, narrowed)
        more = {
            node.name: name
            for node in carried
            if node.name not in widened and decisions[node.name].precision == low
            for slot in sorted(node.back_inputs)
            if (name := node.inputs[slot]) and has.get(name) in FLOAT_TYPES and has[name] != low
        }
        fewer = {
            node.name
            for node in entering
            if node.name not in widened
            and node.name not in narrowed
            and decisions[node.name].precision != low
            and _can_enter_low(graph, node, decisions, has, low)
        }
        if not more and not fewer:
            return decisions
        widened.update(more)
        narrowed |= fewer


def _enters_a_loop(graph: OpGraph, node: OpNode) -> bool:
    """Whether ``node`` is a boundary that takes a value from an enclosing scope into a body
    that runs once per iteration (a loop-carried value, a sliced input): its first output is a
    parameter of such a body, its first input a value of a scope around it."""
    if node.kind is not NodeKind.BOUNDARY or 0 not in node.follow_outputs or not node.inputs:
        return False
    inner = graph.tensors[node.outputs[0]].body
    body = graph.bodies.get(inner)
    if body is None or body.kind is not BodyKind.LOOP:
        return False
    around = {"", *(scope.path for scope in graph.enclosing(inner)[:-1])}
    source = graph.tensors.get(node.inputs[0])
    return source is not None and source.body in around


def _can_enter_low(
    graph: OpGraph, node: OpNode, decisions: dict[str, NodeDecision], has: dict[str, str], low: str
) -> bool:
    """Rule 5's condition: every read of the value inside computes in ``low`` (or reads any
    type), and a loop-carried value's next value is ``low``."""
    readers = graph.consumers(node.outputs[0])
    for reader, slot in readers:
        other = graph.nodes[reader]
        if slot in other.any_type_inputs or (other.kind is NodeKind.CAST and slot == 0):
            continue
        if slot < 0 or slot not in other.follow_inputs or decisions[reader].precision != low:
            return False
    return bool(readers) and all(has.get(node.inputs[s]) == low for s in node.back_inputs)


def _walk(
    graph: OpGraph,
    classes: dict[str, NodeDecision],
    low: str,
    widened: dict[str, str],
    narrowed: set[str],
) -> tuple[dict[str, NodeDecision], dict[str, str]]:
    """One walk in graph order (rules 1-3); ``widened``: loop-carried values found float32;
    ``narrowed``: values entering a loop low (rule 5)."""
    has = {name: tensor.dtype for name, tensor in graph.tensors.items()}
    decisions = dict(classes)
    low_count = 0
    for node in graph:
        decision = classes[node.name]
        if decision.rule in (Rule.ALLOW, Rule.ALLOW_NAME):
            _set_outputs(node, has, low)
            low_count += 1
        elif decision.rule in _FOLLOWERS and node.name in widened:
            decisions[node.name] = NodeDecision(
                op=node.op,
                precision=Precision.FLOAT32,
                rule=decision.rule,
                reason=f"loop-carried value whose next value {widened[node.name]!r} is float32:"
                " one type at entry, in the body and at exit",
                via=graph.tensors[widened[node.name]].producer,
            )
            _set_outputs(node, has, "float32")
        elif decision.rule in _FOLLOWERS and node.name in narrowed:
            what = "its next value is" if node.back_inputs else "it is sliced"
            decisions[node.name] = NodeDecision(
                op=node.op,
                precision=Precision(low),
                rule=decision.rule,
                reason=f"enters a loop in {low}: every op reading it inside computes in {low} "
                f"and {what} {low}, so one Cast before the loop replaces one per iteration",
            )
            _set_outputs(node, has, low)
            low_count += 1
        elif decision.rule in _FOLLOWERS:
            decisions[node.name] = _promoted(graph, node, decision, has, low)
            _set_outputs(node, has, str(decisions[node.name].precision))
            low_count += decisions[node.name].precision == low
        elif node.kind is NodeKind.CAST and node.cast_to:
            has[node.outputs[0]] = node.cast_to
        elif decision.precision in FLOAT_TYPES:
            _set_outputs(node, has, str(decision.precision))
    log.info("promoted: %d of %d nodes %s", low_count, len(graph), low)
    return decisions, has


def _set_outputs(node: OpNode, has: dict[str, str], dtype: str) -> None:
    for slot in node.follow_outputs:
        if node.outputs[slot]:
            has[node.outputs[slot]] = dtype


def _holds_values(shape: tuple[int | str | None, ...] | None) -> bool:
    """Whether a value of ``shape`` decides a promotion: not 0-d, not known to be empty."""
    return shape != () and not (shape is not None and 0 in shape)


def _promoted(
    graph: OpGraph, node: OpNode, decision: NodeDecision, has: dict[str, str], low: str
) -> NodeDecision:
    """The decision of an infer/clear node: the promoted type of what it reads."""
    inputs = [
        node.inputs[slot]
        for slot in sorted(node.follow_inputs)
        if slot < len(node.inputs)
        and slot not in node.back_inputs  # not yet walked: taken to agree (rule 4)
        and slot not in node.float32_params  # a norm's weight and bias (rule 2)
        and has.get(node.inputs[slot]) in FLOAT_TYPES
    ]
    with_dims = [name for name in inputs if _holds_values(graph.tensors[name].shape)]
    inputs = with_dims or inputs
    wide = next((name for name in inputs if has[name] not in LOW_TYPES), None)
    source = wide or (inputs[0] if inputs else None)
    via = graph.tensors[source].producer if source else None
    # a boundary says which value it is (a cond's output, a loop-carried value)
    what = node.params.get("boundary") if node.kind is NodeKind.BOUNDARY else None
    subject = f"{what}," if what else f"{decision.rule} list op"
    if inputs and wide is None and all(has[name] == low for name in inputs):
        wide_params = [
            name
            for slot in sorted(node.float32_params)
            if has.get(name := node.inputs[slot]) not in LOW_TYPES
        ]
        inputs_text = (
            f"whose input is {low} (its float32 parameters {', '.join(map(repr, wide_params))}"
            " do not promote: a mixed-type norm)"
            if wide_params
            else f"whose inputs are all {low}"
        )
        return NodeDecision(
            op=node.op,
            precision=Precision(low),
            rule=decision.rule,
            reason=f"{subject} {inputs_text}: "
            + (f"{low} on both sides" if what else f"computes in {low}, as under autocast"),
            via=via,
        )
    reason = (
        f"{subject} reading {wide!r} in {has[wide]}: "
        + ("float32 on both sides, the promoted type" if what else "computes in the promoted type")
        + ", as under autocast"
        if wide is not None
        else f"{subject} with no float input: computes in float32"
    )
    return NodeDecision(
        op=node.op, precision=Precision.FLOAT32, rule=decision.rule, reason=reason, via=via
    )
