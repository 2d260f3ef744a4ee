"""Applying a reviewed plan: its decisions instead of new ones, and nothing else.

``graphamp convert IN -o OUT --from-plan reviewed.json`` must ship exactly what was reviewed.
:class:`ReviewedDecisionsPass` takes every node's decision from the plan (refusing a model whose
nodes no longer match it); the casts pass derives the edits from those decisions as always; and
:class:`ReviewedRecordsPass` refuses when the casts and weights derived differ from the ones the
plan lists (the model's types or weight values moved since the review). Each refusal names the
first difference, so the user knows what to re-review.
"""

from __future__ import annotations

from graphamp.core.dtypes import LOW_TYPES
from graphamp.core.graph import OpNode
from graphamp.core.vocab import DENY_SEEDS, Rule
from graphamp.errors import GraphampError, InternalError
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.classify import stored_float32_inputs
from graphamp.passes.context import PassContext
from graphamp.plans.plan import Plan
from graphamp.plans.records import NodeDecision


def _reviewed(context: PassContext) -> tuple[Plan, str]:
    """The reviewed plan, and what to call it in errors (its file, else its model)."""
    plan = context.options.reviewed
    if plan is None:
        raise InternalError("a reviewed-plan pass ran without a reviewed plan")
    return plan, context.options.reviewed_where or plan.model or "the plan"


class ReviewedDecisionsPass(Pass):
    """Every node's decision, from the reviewed plan."""

    name = "reviewed_decisions"
    gives = frozenset({Fact.CLASSIFIED, Fact.DECIDED})

    def run(self, context: PassContext) -> PassResult:
        (plan, where), graph = _reviewed(context), context.graph
        for node in graph:
            if node.name not in plan.nodes:
                raise GraphampError(f"{where}: the model's node {node.name!r} is not in the plan")
            if plan.nodes[node.name].op != node.op:
                raise GraphampError(
                    f"{where}: node {node.name!r} is {node.op} in the model but "
                    f"{plan.nodes[node.name].op} in the plan"
                )
        for name in plan.nodes:
            if name not in graph.nodes:
                raise GraphampError(f"{where}: the plan's node {name!r} is not in the model")
        for node in graph:
            if plan.nodes[node.name].precision in LOW_TYPES:
                _check_low(node, plan.nodes[node.name], context, where)
        context.decisions = {node.name: plan.nodes[node.name] for node in graph}
        return PassResult(modified=False)


def _check_low(node: OpNode, decision: NodeDecision, context: PassContext, where: str) -> None:
    """A node the plan puts in low precision can be: not a deny seed, admitted by its schema,
    and reading no weight whose values now overflow (never clamped, reviewed or not)."""
    low = context.policy.dtype
    if decision.rule in DENY_SEEDS or (
        decision.precision != low and decision.rule is not Rule.ALREADY_LOW
    ):
        raise GraphampError(
            f"{where}: node {node.name!r} is planned {decision.precision} under rule "
            f"{decision.rule}, which a {low} plan cannot hold"
        )
    if decision.precision not in node.allowed_types:
        raise GraphampError(
            f"{where}: node {node.name!r} ({node.op}) is planned {decision.precision}, "
            f"which its schema ({node.schema_source}) does not admit"
        )
    for weight in stored_float32_inputs(node, context.weights):
        stats = context.weights.stats(weight)
        if stats.overflows:
            raise GraphampError(
                f"{where}: node {node.name!r} is planned {low} but weight {weight!r} now holds "
                f"|x| up to {stats.absmax:.6g}"
            )


class ReviewedRecordsPass(Pass):
    """Refuse when the derived casts and weights are not the reviewed ones."""

    name = "reviewed_records"
    requires = frozenset({Fact.EDITS})

    def applies(self, context: PassContext) -> bool:
        return context.options.reviewed is not None

    def run(self, context: PassContext) -> PassResult:
        reviewed, where = _reviewed(context)
        difference = first_difference(
            _decided(reviewed.to_dict()), _decided(context.plan().to_dict())
        )
        if difference is not None:
            raise GraphampError(
                f"{where}: the model no longer matches the reviewed plan (or the plan was "
                "edited): "
                f"{difference}"
            )
        return PassResult(modified=False)


_SECTIONS = ("dtype", "casts", "casts_retargeted", "casts_removed", "weights")


def _decided(plan: dict[str, object]) -> dict[str, object]:
    """A plan dict without what is estimated rather than decided (a Cast's bytes: a plan
    written before they were recorded holds the same decisions)."""
    casts = plan.get("casts")
    if not isinstance(casts, list):
        return plan
    plain = [{k: v for k, v in c.items() if k != "bytes"} for c in casts if isinstance(c, dict)]
    return {**plan, "casts": plain}


def first_difference(reviewed: dict[str, object], derived: dict[str, object]) -> str | None:
    """The first entry in which two plan dicts differ, in words; None if none does."""
    for section in _SECTIONS:
        old, new = reviewed.get(section), derived.get(section)
        if old == new:
            continue
        if isinstance(old, list) and isinstance(new, list):
            for index in range(max(len(old), len(new))):
                a = old[index] if index < len(old) else None
                b = new[index] if index < len(new) else None
                if a != b:
                    return f"{section} entry {index + 1}: plan has {a}, the model gives {b}"
        if isinstance(old, dict) and isinstance(new, dict):
            for key in sorted(old.keys() | new.keys()):
                if old.get(key) != new.get(key):
                    a, b = old.get(key), new.get(key)
                    return f"{section} {key!r}: plan has {a}, the model gives {b}"
        return f"{section}: plan has {old}, the model gives {new}"
    return None
