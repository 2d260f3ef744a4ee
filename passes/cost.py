"""cost: the precision of infer and clear ops chosen to move the fewest bytes through Casts.

For policies that say ``spread = "cost"`` (the ONNX default). Every rule a decision obeys
elsewhere still holds: allow-class ops run low; deny ops, name rules, schema types, the
target's kernels, weight and value ranges, tune's set keep theirs float32; deny spreads forward
exactly as under TensorFlow's rules (the paint pass's rule 2). What is left, the infer and
clear ops (and the boundary nodes of bodies, which follow their neighbours as clear ops do), is
*free*: each may run low or float32, and the choice is the one that minimises the bytes Casts
move at run time plus the bytes of the stored weights, a minimum cut:

1. A float32 value costs a Cast where its producer and a reader disagree: one Cast per
   (value, type) shared by all readers, so the cost is paid once whatever the number of
   readers (a hyperedge: ``elements x (4 + 2)`` bytes for float16, read and written).
   Graph inputs not kept by ``keep_io_types`` take the type their readers want; a kept graph
   output reads float32 (a Cast back where it is computed low), a KV cache's present output
   the type its past input takes; a Cast already in the model may be retargeted to the low
   type; a slot that reads any type (``Shape``) costs nothing.
2. A stored float32 weight costs its bytes in each type some reader wants it in (once stored
   low, once float32, or both): a weight read only through exact ops (a Gather's table, a
   Transpose's input) is then stored low when that is cheaper than the Casts it brings,
   which is almost always (the rows a Gather reads are cast, not the table). A quantisation
   scale (a DequantizeLinear's or QuantizeLinear's input 1) costs nothing either way: its few
   bytes would otherwise pull the float ops between a DequantizeLinear and a QuantizeLinear
   (a residual Add, a pool) into the low type for no Cast saved, and round what the next
   quantiser reads.
3. Elements come from shapes; a symbolic dimension counts
   :data:`graphamp.core.dtypes.SYMBOLIC_DIM` (1: batch 1, one token; the weights weigh against one
   token's activations); a value of unknown rank counts one element. A value inside a loop
   body counts :data:`LOOP_RUNS` times per enclosing loop.
4. Ties stay float32 (the cut with the fewest ops low).

The free ops split into regions that share no cost (connected through the costs above); each
region is one minimum cut over a small flow graph (:mod:`graphamp.passes.min_cut`): ops low on
the source side, float32 on the sink side, each cost an edge or a hyperedge of two edges and an
auxiliary node.
Each free op's reason says what the other choice would cost (its own flip, the rest kept).
"""

from __future__ import annotations

import logging
from collections import defaultdict

from graphamp.core.dtypes import estimated_elements, itemsize
from graphamp.core.graph import BodyKind, NodeKind, OpGraph, OpNode, TensorInfo
from graphamp.core.vocab import Precision, Rule
from graphamp.passes.base import Fact, Pass, PassResult, register
from graphamp.passes.classify import SCALED_OPS
from graphamp.passes.context import PassContext
from graphamp.passes.min_cut import F32, LOW, Cost, cut
from graphamp.passes.output_casts import cache_pairs
from graphamp.passes.paint import deny_spread_decisions
from graphamp.plans.records import NodeDecision
from graphamp.policy.policy import Policy

log = logging.getLogger(__name__)

LOOP_RUNS = 10  # what a loop body's iterations count as, per enclosing loop
_FREE = (Rule.INFER, Rule.CLEAR)


@register
class CostPass(Pass):
    """Decide infer and clear ops by a minimum cut of Cast and weight bytes (module
    docstring)."""

    name = "cost"
    requires = frozenset({Fact.CLASSIFIED})
    gives = frozenset({Fact.DECIDED})
    after = ("classify", "saturation", "range", "tuned")

    def applies(self, context: PassContext) -> bool:
        return context.policy.spread == "cost"

    def run(self, context: PassContext) -> PassResult:
        context.decisions = decide_by_cost(context.graph, context.decisions, context.policy)
        return PassResult(modified=False)


def decide_by_cost(
    graph: OpGraph, classes: dict[str, NodeDecision], policy: Policy
) -> dict[str, NodeDecision]:
    """Final precision of every node; ``classes`` comes from classify (and the passes that
    keep nodes float32 after it)."""
    low = policy.dtype
    decisions = dict(classes)
    decisions.update(deny_spread_decisions(graph, classes))
    free = {
        name
        for name, d in decisions.items()
        if d.rule in _FREE and graph.nodes[name].kind in (NodeKind.OP, NodeKind.BOUNDARY)
    }
    costs = _costs(graph, decisions, free, policy)
    side = _solve(free, costs)
    fixed = {
        name: LOW if d.precision == low and d.rule is not Rule.ALREADY_LOW else F32
        for name, d in decisions.items()
        if name not in free
    }
    now, other = _prices(costs, side, free)
    low_count = 0
    for node in graph:
        if node.name not in free:
            continue
        here = side[node.name]
        decisions[node.name] = _decision(
            graph,
            node,
            classes[node.name],
            here,
            now.get(node.name, 0),
            other.get(node.name, 0),
            side,
            fixed,
            low,
        )
        low_count += here == LOW
    log.info("cost: %d of %d free ops %s", low_count, len(free), low)
    return decisions


def _prices(
    costs: list[Cost], side: dict[str, str], free: set[str]
) -> tuple[dict[str, int], dict[str, int]]:
    """(what the costs of each free op cost with the cut as it is, what they would cost were
    that op alone on the other side). A cost is paid when a member is on another side than
    its head: with its members' sides counted once, a flip is priced in O(1) per cost."""
    now: dict[str, int] = defaultdict(int)
    other: dict[str, int] = defaultdict(int)
    for cost in costs:
        members = cost.members
        head = side.get(cost.head, cost.head)
        low = sum(side.get(m, m) == LOW for m in members)
        wide = len(members) - low
        paid = wide > 0 if head == LOW else low > 0
        among = frozenset(members) if len(members) > 4 else members
        for name in {cost.head, *members} & free:
            flipped = F32 if side[name] == LOW else LOW
            now_head = flipped if name == cost.head else head
            now_low, now_wide = low, wide
            if name in among:
                step = 1 if flipped == LOW else -1
                now_low, now_wide = low + step, wide - step
            if paid:
                now[name] += cost.cost
            if now_wide > 0 if now_head == LOW else now_low > 0:
                other[name] += cost.cost
    return now, other


def _decision(
    graph: OpGraph,
    node: OpNode,
    decision: NodeDecision,
    here: str,
    now: int,
    other: int,
    side: dict[str, str],
    fixed: dict[str, str],
    low: str,
) -> NodeDecision:
    what = node.params.get("boundary") if node.kind is NodeKind.BOUNDARY else None
    subject = f"{what}," if what else f"{decision.rule} list op"
    plain = what or decision.reason.startswith(f"{decision.rule} list")
    own = "" if plain else f"; {decision.reason}"
    if not now and not other:
        reason = f"{subject} with no Cast or weight at stake either way: float32{own}"
        return NodeDecision(decision.op, Precision.FLOAT32, decision.rule, reason)
    there = "float32" if here == LOW else low
    saving = (
        f"{there} here would move {other - now} bytes more through Casts and weights"
        if other > now
        else f"{there} here would move no fewer bytes (a tie stays float32)"
    )
    precision = Precision(low) if here == LOW else Precision.FLOAT32
    reason = f"{subject} in {precision}, the cheapest cut of its region: {saving}{own}"
    via = _via(graph, node, side, fixed)
    return NodeDecision(decision.op, precision, decision.rule, reason, via=via)


def _via(graph: OpGraph, node: OpNode, side: dict[str, str], fixed: dict[str, str]) -> str | None:
    """The dataflow neighbour the decision leans on: one on the same side whose side is fixed
    (an allow op, a deny op), else a free one on the same side."""
    here = side[node.name]
    near = graph.dataflow.neighbours(node.name)
    # (plain loops: no generator per node)
    for name in near:
        if fixed.get(name) == here:
            return name
    for name in near:
        if side.get(name) == here:
            return name
    return None


def _costs(
    graph: OpGraph, decisions: dict[str, NodeDecision], free: set[str], policy: Policy
) -> list[Cost]:
    """Every cost that depends on a free op (rules 1-3 of the module docstring)."""
    low = policy.dtype
    caches = cache_pairs(graph)
    # each node's side where it follows: its own name for a free op, else its fixed terminal
    node_side = {
        name: name
        if name in free
        else LOW
        if d.precision == low and d.rule is not Rule.ALREADY_LOW
        else F32
        for name, d in decisions.items()
    }

    def reader_side(node: OpNode, slot: int) -> str | None:
        """The side a slot's reader is on (a free op by name), None when it reads any type."""
        if slot >= 0 and (
            slot in node.any_type_inputs or (node.kind is NodeKind.CAST and slot == 0)
        ):
            return None
        if slot < 0 or slot not in node.follow_inputs:
            return F32
        return node_side[node.name]

    def producer_side(tensor: TensorInfo) -> str:
        if tensor.is_graph_input:
            movable = not (
                tensor.type_fixed or policy.keeps_io(tensor.name) or tensor.is_graph_output
            )
            return f"\0input:{tensor.name}" if movable else F32
        node = graph.nodes[tensor.producer]  # type: ignore[index]
        if node.kind is NodeKind.CAST:  # a Cast of the model to float32: retargetable
            return F32 if tensor.is_graph_output else f"\0cast:{node.name}"
        if not any(node.outputs[s] == tensor.name for s in node.follow_outputs):
            return F32
        return node_side[node.name]

    # a kept output reads float32 (a Cast back); a KV cache's present output reads the type
    # its past input takes (a Cast back where they differ: a generation loop feeds it back)
    past_of = {present: past for past, present in caches.items()}
    output_side = {
        name: F32 if policy.keeps_io(name) else producer_side(graph.tensors[past_of[name]])
        for name in graph.graph_outputs
        if policy.keeps_io(name) or name in past_of
    }
    low_bytes, wide = itemsize(low), itemsize("float32")
    costs: list[Cost] = []
    nodes, consumers = graph.nodes, graph.consumers
    for name, tensor in graph.tensors.items():
        if tensor.dtype != "float32":
            continue
        readers = consumers(name)
        if name not in output_side and not any(n in free for n, _ in readers):
            producer = tensor.producer
            if (tensor.is_constant and not tensor.is_graph_input) or (
                producer is not None
                and producer not in free
                and nodes[producer].kind is not NodeKind.CAST
            ):
                continue  # every end is a terminal: the cost decides nothing (_decides)
        sides = [reader_side(nodes[n], k) for n, k in readers]
        if name in output_side:
            sides.append(output_side[name])
        members = tuple(dict.fromkeys(s for s in sides if s is not None))
        count = estimated_elements(tensor.shape) or 1
        if tensor.is_constant and not tensor.is_graph_input:
            if _only_scales(graph, name):
                continue  # a quantisation scale's bytes decide nothing (module docstring)
            if _decides(F32, members):  # stored low for some reader
                costs.append(Cost(count * low_bytes, F32, members))
            if _decides(LOW, members):  # stored float32 for some reader
                costs.append(Cost(count * wide, LOW, members))
            continue
        bytes_moved = count * (low_bytes + wide)
        if tensor.body:  # (a main-graph value runs once: most of a graph's values)
            loops = sum(b.kind is BodyKind.LOOP for b in graph.enclosing(tensor.body))
            bytes_moved *= LOOP_RUNS**loops
        head = producer_side(tensor)
        if _decides(head, members):
            costs.append(Cost(bytes_moved, head, members))
    return costs


def _only_scales(graph: OpGraph, name: str) -> bool:
    """Whether every reader of ``name`` reads it as a quantisation scale."""
    readers = graph.consumers(name)
    return bool(readers) and all(
        slot == 1 and graph.nodes[node].op in SCALED_OPS for node, slot in readers
    )


def _decides(head: str, members: tuple[str, ...]) -> bool:
    """Whether a cost of ``head`` and ``members`` can be paid or not depending on a free op
    (the rest decide nothing: paid always, never, or only by a variable no free op shares a
    cost with, which the region search finds anyway)."""
    return any(m != head for m in members) and (
        head not in (LOW, F32) or any(m not in (LOW, F32) for m in members)
    )


def _solve(free: set[str], costs: list[Cost]) -> dict[str, str]:
    """The side of every variable (free ops, movable inputs, model Casts) in a minimum cut of
    ``costs``: one flow for all regions (those that share no cost are cut as they would be
    alone; a region of one variable goes low only where that is strictly cheaper, as pricing
    it both ways would say), float32 for a free op no cost depends on."""
    side = dict.fromkeys(free, F32)
    side.update(cut(costs))
    return side
