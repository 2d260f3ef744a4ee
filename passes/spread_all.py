"""spread_all: every float op low that no rule keeps float32, for ``spread = "all"``.

What onnxconverter-common's and onnxruntime's float16 tools do, and Paddle's "pure float16"
(level O2): every op runs in the low type except a block list. Rules:

1. Infer and clear ops, and the boundary nodes of If/Loop/Scan bodies and functions (which
   classify makes clear), run low: their bodies are converted like the main graph.
2. An op in no list runs low too. Classify gives such an op, under this spread, the schema,
   kernel and weight checks a listed op gets, so one that reaches this pass as ``unlisted``
   has a kernel for the low type on the target and reads no weight that would overflow it.
3. Everything else keeps its decision: allow ops are low already; a deny-list op, a name or
   tensor rule, a schema type, a missing kernel, a weight's or a calibrated value's range,
   tune's set, the qdq rule and a decision the input model already holds keep theirs float32.
   Deny does not spread (the peers' block lists do not): a Cast before and after a deny op.
"""

from __future__ import annotations

import logging

from graphamp.core.graph import NodeKind, OpGraph
from graphamp.core.vocab import Precision, Rule
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.plans.records import NodeDecision

log = logging.getLogger(__name__)

_LOWERED = (Rule.INFER, Rule.CLEAR, Rule.UNLISTED)


class SpreadAllPass(Pass):
    """Run low every op that no rule keeps float32 (module docstring)."""

    name = "spread_all"
    requires = frozenset({Fact.CLASSIFIED})
    gives = frozenset({Fact.DECIDED})

    def run(self, context: PassContext) -> PassResult:
        context.decisions = lower_all(context.graph, context.decisions, context.policy.dtype)
        return PassResult(modified=False)


def lower_all(
    graph: OpGraph, classes: dict[str, NodeDecision], low: str
) -> dict[str, NodeDecision]:
    """Final precision of every node; ``classes`` comes from classify (and the passes that
    keep nodes float32 after it)."""
    decisions = dict(classes)
    precision = Precision(low)
    made: dict[tuple[Rule, str], str] = {}  # reasons, made once per (rule, classify reason)
    for node in graph:
        decision = classes[node.name]
        if decision.rule not in _LOWERED or node.kind not in (NodeKind.OP, NodeKind.BOUNDARY):
            continue
        key = (decision.rule, decision.reason)
        reason = made.get(key)
        if reason is None:
            reason = made[key] = _reason(decision, node.params.get("boundary"), low)
        decisions[node.name] = NodeDecision(decision.op, precision, decision.rule, reason)
    log.info("spread all: %d nodes %s", sum(d.precision == low for d in decisions.values()), low)
    return decisions


def _reason(decision: NodeDecision, boundary: object, low: str) -> str:
    """Why a node ``decision`` classified (a body's ``boundary``, else None) runs low."""
    subject = f"{boundary}," if boundary else f"{decision.rule} list op"
    if decision.rule is Rule.UNLISTED:
        subject = f"{decision.op}, in no list,"
    return f"{subject} in {low}: --spread all runs every op low that no rule keeps float32"
