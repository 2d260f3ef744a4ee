"""speculation_check: prove what a speculative range check assumed, for the values no writer
will check.

``graphamp convert`` lets weights on disk go unread by the passes (``speculate_weights``: each
is assumed to fit the target, and the writer checks it chunk by chunk as it converts it; see
:class:`~graphamp.passes.weights.WeightRanges`). A weight that is not converted (every reader
float32) is never written through that check, yet had it overflowed, classify would have kept
its readers float32 by rule ``weight_range`` and the plan would list it as kept. So, once the
edits are known, those weights are measured here; the first that overflows raises
:class:`~graphamp.errors.WeightOverflow`, and the conversion starts over without speculating.
With every assumption checked, a speculative conversion gives the plan and the model the
scan-first one gives.

A weight that float8 stores itself (a scale record of source ``weight``: a float8 matrix
weight, an 8-bit embedding table) is not written through that check either: its low copy is
dropped where nothing else reads it. Those are measured here too, and their plan records take
the counts (values flushed to zero, at float32's limit) a scan-first conversion records, so
that ``convert --from-plan`` (which scans first) finds the same plan.
"""

from __future__ import annotations

from graphamp.errors import WeightOverflow
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext


class SpeculationCheckPass(Pass):
    """Measure the deferred weights nothing will convert (see the module docstring)."""

    name = "speculation_check"
    requires = frozenset({Fact.EDITS})

    def applies(self, context: PassContext) -> bool:
        return context.weights.speculate

    def run(self, context: PassContext) -> PassResult:
        stored_8bit = {record.tensor for record in context.scales if record.source == "weight"}
        converted = {record.name for record in context.script.weights} - stored_8bit
        overflowing = context.weights.check_deferred(converted)
        if overflowing is not None:
            raise WeightOverflow(overflowing, context.policy.dtype)
        for record in context.script.weights:
            if record.name in stored_8bit and record.dst == context.policy.dtype:
                stats = context.weights.stats(record.name, record.dst)
                record.flushed_to_zero, record.at_limit = stats.flushed, stats.at_limit
        return PassResult(modified=False)
