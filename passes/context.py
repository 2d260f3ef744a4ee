"""The context the passes share for one graph: what they read (the graph, the policy,
options) and what they write (decisions, the edit script, kept weights, warnings, facts).

It lives apart from :mod:`graphamp.passes.base` so that the rules checked between passes
(:mod:`graphamp.passes.invariants`, which the manager in ``base`` calls) read it without an
import circle.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from graphamp.core.graph import OpGraph
from graphamp.passes.facts import Fact
from graphamp.passes.options import Options
from graphamp.passes.weights import WeightRanges
from graphamp.plans.edits import EditScript
from graphamp.plans.plan import Plan
from graphamp.plans.records import (
    Fp8Decision,
    NodeDecision,
    RewriteRecord,
    ScaleRecord,
    WeightRecord,
)
from graphamp.policy.policy import Policy


@dataclass
class PassContext:
    """Everything the passes read and write for one graph; ``options`` are the run's inputs
    to the optional passes (:class:`~graphamp.passes.options.Options`)."""

    graph: OpGraph
    policy: Policy
    options: Options = field(default_factory=Options)
    decisions: dict[str, NodeDecision] = field(default_factory=dict)
    script: EditScript = field(default_factory=EditScript)
    kept_weights: list[WeightRecord] = field(default_factory=list)
    # patterns replaced by fused ops (the fuse_norms pass); the casts pass hands them on
    rewrites: list[RewriteRecord] = field(default_factory=list)
    # float8 (the fp8 pass, with Options.fp8): per matrix op decided low, and the scales
    fp8_decisions: dict[str, Fp8Decision] = field(default_factory=dict)
    scales: list[ScaleRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what the user should hear about
    facts: set[Fact] = field(default_factory=set)
    seconds: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Stored values are scanned once, when a pass first asks about one.
        self.weights = WeightRanges(
            self.graph, self.policy.dtype, speculate=self.options.speculate_weights
        )

    def plan(self, label: str = "") -> Plan:
        """The record of what the passes decided: the decisions of the graph's nodes (with
        the FLOPs the dialect measured), casts and weights."""
        decisions = {}
        for node in self.graph:
            decision = self.decisions.get(node.name)
            if decision is None:  # a step graph's backward ops: autograd decides them
                continue
            if node.flops is not None and decision.flops != node.flops:
                decision = dataclasses.replace(decision, flops=node.flops)
            if _module_not_in_name(node.name, node.scope) and decision.module != node.scope:
                decision = dataclasses.replace(decision, module=node.scope)
            decisions[node.name] = decision
        script = self.script
        return Plan(
            dtype=self.policy.dtype,
            policy=self.policy.to_dict(),
            nodes=decisions,
            casts=script.casts,
            output_casts=script.output_casts,
            weights=script.weights,
            kept_weights=self.kept_weights,
            casts_retargeted=script.retarget_casts,
            casts_removed=script.remove_nodes,
            rewrites=script.rewrites,
            fp8_settings=fp8.to_dict() if (fp8 := self.options.fp8) is not None else None,
            fp8=dict(self.fp8_decisions),
            scales=list(self.scales),
            model=label,
        )


def _module_not_in_name(name: str, scope: str) -> bool:
    """Whether ``scope`` is a module path the node's name does not carry (torch.onnx's dynamo
    exporter: ``node_MatMul_3`` from ``layers.0.attention``), which the plan then records."""
    return bool(scope) and scope != name and not name.startswith(f"{scope}/")
