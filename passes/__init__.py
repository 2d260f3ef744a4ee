"""graphamp's analysis passes: pure functions over an OpGraph and a Policy (installed as
``graphamp.passes``). They never import onnx or torch.

* :mod:`classify` gives each node its initial class and reason,
* :mod:`paint` spreads precisions along the dataflow (TensorFlow's semantics),
* :mod:`casts` turns the decisions into casts, weight conversions and cast clean-up.
"""

from __future__ import annotations

import logging

from graphamp.graph import OpGraph
from graphamp.passes.casts import plan_casts
from graphamp.passes.classify import classify
from graphamp.passes.paint import paint
from graphamp.plan import Plan
from graphamp.policy import Policy

log = logging.getLogger(__name__)


def run_passes(graph: OpGraph, policy: Policy, *, model: str = "") -> Plan:
    """classify -> paint -> casts: the whole analysis for one graph."""
    decisions = paint(graph, classify(graph, policy), policy)
    plan = Plan(dtype=policy.dtype, policy=policy.to_dict(), nodes=decisions, model=model)
    plan.edits = plan_casts(graph, decisions, policy)
    if log.isEnabledFor(logging.DEBUG):  # graphamp -vv: every decision, in graph order
        for name, decision in decisions.items():
            via = f" via {decision.via}" if decision.via else ""
            log.debug(
                "%s (%s): %s, %s: %s%s",
                name,
                decision.op,
                decision.precision,
                decision.rule,
                decision.reason,
                via,
            )
    for node in graph:
        if "flops" in node.attrs:
            decisions[node.name].flops = int(node.attrs["flops"])  # type: ignore[call-overload]
    return plan


__all__ = ["classify", "paint", "plan_casts", "run_passes"]
