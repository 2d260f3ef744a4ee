"""tuned: keep float32 the nodes ``graphamp tune`` found, as ``deny_names`` would.

``options.tuned`` is a set of node names (what tune's search found must stay
float32 for the model to meet its tolerance). Each such node that classify and the range rule
would let run low becomes float32 with rule ``tuned``, a deny seed: paint spreads deny from it
exactly as from a ``deny_names`` rule, so the ``deny_names = [...]`` snippet tune prints gives
the same precisions.
"""

from __future__ import annotations

from graphamp.core.vocab import Precision, Rule
from graphamp.errors import GraphampError
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.plans.records import NodeDecision

_LOWERABLE = frozenset({Rule.ALLOW, Rule.ALLOW_NAME, Rule.INFER, Rule.CLEAR})


class TunedPass(Pass):
    """Keep float32 the nodes tune found (module docstring)."""

    name = "tuned"
    requires = frozenset({Fact.CLASSIFIED})

    def applies(self, context: PassContext) -> bool:
        return bool(context.options.tuned)

    def run(self, context: PassContext) -> PassResult:
        names = sorted(context.options.tuned)
        missing = [name for name in names if name not in context.decisions]
        if missing:
            raise GraphampError(f"tuned node {missing[0]!r} is not a node of the model")
        kept = 0
        for name in names:
            decision = context.decisions[name]
            if decision.rule not in _LOWERABLE:
                continue
            context.decisions[name] = NodeDecision(
                op=decision.op,
                precision=Precision.FLOAT32,
                rule=Rule.TUNED,
                reason="kept float32 by graphamp tune: the model misses its tolerance on the "
                "data with this node low",
            )
            kept += 1
        return PassResult(modified=False, note=f"{kept} nodes kept float32 by tune")
