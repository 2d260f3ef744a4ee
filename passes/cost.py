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
4. Ties go low: an op that computes low also reads and writes its computation-type values in
   half the bytes (``elements x (4 - 2)`` more in float32 for float16). That traffic is
   counted after the Casts' and weights' bytes: of the cuts that move the fewest of those, the
   one where the ops left float32 would read and write the fewest bytes, so a clear or infer op
   between a float32 op and a low one (one Cast before it or after it) runs low, as
   TensorFlow, MXNet and Paddle paint it, and no decision the Casts and weights make moves.
   It counts where a low op reads or writes a value of the free ops' region (joined through
   values): a region no low op touches (float ops between quantisers, whose scales cost
   nothing either way) stays float32, as TensorFlow's colouring leaves it, and so does what is
   still a tie (a graph input, a Cast of the model, a body's boundary: none computes).

The free ops split into regions that share no cost (connected through the costs above); each
region is one minimum cut over a small flow graph (:mod:`graphamp.passes.min_cut`): ops low on
the source side, float32 on the sink side, each cost an edge or a hyperedge of two edges and an
auxiliary node. The sides are numbered once and the costs listed over those numbers
(:mod:`graphamp.passes.cost_terms`).
Each free op's reason says what the other choice would cost (its own flip, the rest kept).
"""

from __future__ import annotations

import logging

from graphamp.core.graph import NodeKind, OpGraph
from graphamp.core.vocab import Precision, Rule
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.passes.cost_terms import LOOP_RUNS, cost_terms
from graphamp.passes.min_cut import F32, LOW, cut
from graphamp.passes.paint import deny_spread_decisions
from graphamp.plans.records import NodeDecision
from graphamp.policy.policy import Policy

__all__ = ["F32", "LOOP_RUNS", "LOW", "CostPass", "decide_by_cost"]

log = logging.getLogger(__name__)


class CostPass(Pass):
    """Decide infer and clear ops by a minimum cut of Cast and weight bytes (module
    docstring)."""

    name = "cost"
    requires = frozenset({Fact.CLASSIFIED})
    gives = frozenset({Fact.DECIDED})

    def run(self, context: PassContext) -> PassResult:
        context.decisions = decide_by_cost(context.graph, context.decisions, context.policy)
        return PassResult(modified=False)


def decide_by_cost(
    graph: OpGraph, classes: dict[str, NodeDecision], policy: Policy
) -> dict[str, NodeDecision]:
    """Final precision of every node; ``classes`` comes from classify (and the passes that
    keep nodes float32 after it)."""
    decisions = dict(classes)
    decisions.update(deny_spread_decisions(graph, classes))
    terms = cost_terms(graph, decisions, policy)
    side = cut(len(terms.names), terms.costs, terms.preferences())
    now, other = terms.prices(side)
    reasons = _Reasons(policy.dtype)
    neighbours = graph.dataflow.neighbours
    nodes, names, side_of, own = graph.nodes, terms.names, terms.side_of, terms.own
    low_count = 0
    for number in terms.free:
        name = names[number]
        node, decision = nodes[name], classes[name]
        boundary = node.params.get("boundary") if node.kind is NodeKind.BOUNDARY else None
        what = None if boundary is None else str(boundary)
        paid, flipped = now[number], other[number]
        here = side[number] if paid or flipped else None  # None: nothing at stake
        more = flipped - paid
        saved = own[number - terms.free.start] if here == LOW and not more else 0
        precision, reason = reasons.of(what, decision, here, more, saved)
        via = None if here is None else _via(neighbours(name), here, side, side_of)
        decisions[name] = NodeDecision(decision.op, precision, decision.rule, reason, via=via)
        low_count += side[number] == LOW
    log.info("cost: %d of %d free ops %s", low_count, len(terms.free), policy.dtype)
    return decisions


class _Reasons:
    """The precision and sentence of each free op's decision, each made once: most free ops
    share their subject (the list that made them free), side and what a flip would cost."""

    def __init__(self, low: str) -> None:
        self.low = low
        self._made: dict[
            tuple[str | None, Rule, str, int | None, int, int], tuple[Precision, str]
        ] = {}

    def of(
        self, what: str | None, decision: NodeDecision, here: int | None, more: int, saved: int
    ) -> tuple[Precision, str]:
        """For a free op (a body's boundary ``what``, else None) classified ``decision``, on
        side ``here`` (None: no Cast or weight at stake) where a flip would move ``more``
        bytes more through Casts and weights and, for a tie that went low, ``saved`` bytes
        more through the op itself."""
        key = (what, decision.rule, decision.reason, here, more, saved)
        found = self._made.get(key)
        if found is None:
            found = self._made[key] = self._make(what, decision, here, more, saved)
        return found

    def _make(
        self, what: str | None, decision: NodeDecision, here: int | None, more: int, saved: int
    ) -> tuple[Precision, str]:
        subject = f"{what}," if what else f"{decision.rule} list op"
        plain = what or decision.reason.startswith(f"{decision.rule} list")
        own = "" if plain else f"; {decision.reason}"
        if here is None:
            reason = f"{subject} with no Cast or weight at stake either way: float32{own}"
            return Precision.FLOAT32, reason
        there = "float32" if here == LOW else self.low
        if more > 0:
            saving = f"{there} here would move {more} bytes more through Casts and weights"
        elif saved:
            saving = (
                f"{there} here would move no fewer bytes through Casts and weights, and "
                f"{saved} bytes more through the op itself (a tie goes low)"
            )
        elif here == LOW:
            saving = f"{there} here would move no fewer bytes (a tie, low with the ops around it)"
        else:
            saving = f"{there} here would move no fewer bytes (a tie stays float32)"
        precision = Precision(self.low) if here == LOW else Precision.FLOAT32
        return precision, f"{subject} in {precision}, the cheapest cut of its region: {saving}{own}"


def _via(near: list[str], here: int, side: list[int], side_of: dict[str, int]) -> str | None:
    """The dataflow neighbour the decision leans on: one on the same side whose side is fixed
    (an allow op, a deny op), else a free one on the same side."""
    free_one = None
    for name in near:
        number = side_of[name]
        if number <= F32:  # fixed: its number is its side
            if number == here:
                return name
        elif free_one is None and side[number] == here:
            free_one = name
    return free_one
