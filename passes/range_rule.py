"""range: keep float32 the ops whose values leave the target type's range on calibration data.

With ``options.ranges`` (a :class:`~graphamp.numerics.ranges.Ranges`, what
``graphamp.onnx.calibrate`` or ``graphamp.fx.convert(..., calibrate=...)`` recorded on the
float32 model), every op that classify would let run low (allow, infer or clear) and that reads
or writes, in a computation-type slot, a value beyond the target's limit
(:func:`graphamp.numerics.ranges.range_decisions`: float16 past 65504 / 2, bfloat16 past what it
holds) stays float32 with rule ``range``; the reason names the value and its magnitude. It runs
after classify and before paint/promote, which leave a ``range`` node float32 as they leave a
``weight_range`` one: it does not spread deny (every op that reads the large value is caught by
the rule itself).
"""

from __future__ import annotations

from graphamp.core.vocab import Precision, Rule
from graphamp.numerics.ranges import range_decisions
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.plans.records import NodeDecision

# The classes the rule overrides: those that may end low. A node already float32 for a reason
# of its own (deny lists, name rules, schema) keeps that reason.
_LOWERABLE = frozenset({Rule.ALLOW, Rule.ALLOW_NAME, Rule.INFER, Rule.CLEAR})


class RangePass(Pass):
    """Keep float32 the ops whose calibrated values overflow the target (module docstring)."""

    name = "range"
    requires = frozenset({Fact.CLASSIFIED})

    def applies(self, context: PassContext) -> bool:
        return context.options.ranges is not None

    def run(self, context: PassContext) -> PassResult:
        ranges = context.options.ranges
        assert ranges is not None  # applies() checked it
        found = range_decisions(
            ranges, context.graph, context.policy.dtype, margin=context.options.range_margin
        )
        kept = 0
        for name, finding in found.items():
            decision = context.decisions.get(name)
            if decision is None or decision.rule not in _LOWERABLE:
                continue
            context.decisions[name] = NodeDecision(
                op=decision.op,
                precision=Precision.FLOAT32,
                rule=Rule.RANGE,
                reason=finding.reason,
            )
            kept += 1
        return PassResult(modified=False, note=f"{kept} ops kept float32 by their range")
