"""The engine: one conversion for every dialect.

read (the dialect) -> passes (the pass manager, over the neutral graph) -> plan (the record)
and edit script -> apply (the dialect). With ``reviewed=`` a reviewed plan's decisions are
applied instead of new ones, and a model that no longer matches the plan is refused.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from dataclasses import dataclass
from typing import Any

from graphamp.core import collector
from graphamp.core.graph import OpGraph
from graphamp.dialects.base import Dialect, ReadGraph
from graphamp.dialects.registry import for_source
from graphamp.errors import GraphampError, PolicyWarning
from graphamp.passes import PassContext, PassManager
from graphamp.plans.edits import EditScript
from graphamp.plans.plan import Plan
from graphamp.policy.policy import Policy

log = logging.getLogger("graphamp")


@dataclass
class Analysis:
    """A model read and decided, not yet converted."""

    dialect: Dialect
    read: ReadGraph
    plan: Plan
    script: EditScript
    seconds: dict[str, float]
    warnings: list[str] = dataclasses.field(default_factory=list)

    @property
    def graph(self) -> OpGraph:
        return self.read.graph


@dataclass
class Conversion:
    """A converted model (the dialect's type), its plan, timings and the input's graph."""

    model: Any
    plan: Plan
    seconds: dict[str, float]
    graph: OpGraph
    script: EditScript | None = None  # the edits applied (what the summary reports on)


def analyse(
    source: object,
    policy: Policy,
    *,
    dialect: Dialect | None = None,
    reviewed: Plan | None = None,
    options: dict[str, Any] | None = None,
    label: str | None = None,
) -> Analysis:
    """Load ``source`` (a path or a model object), read it and run the passes."""
    dialect = dialect or for_source(source)
    seconds: dict[str, float] = {}
    with collector.paused():
        start = time.perf_counter()
        model = dialect.load(source)
        seconds["load"] = time.perf_counter() - start
        return analyse_model(
            dialect,
            model,
            policy,
            reviewed=reviewed,
            options=options,
            label=label if label is not None else dialect.label(source),
            seconds=seconds,
        )


def analyse_model(
    dialect: Dialect,
    model: Any,
    policy: Policy,
    *,
    reviewed: Plan | None = None,
    options: dict[str, Any] | None = None,
    label: str = "",
    seconds: dict[str, float] | None = None,
) -> Analysis:
    """Read a loaded ``model`` and run the passes over its graph."""
    seconds = dict(seconds or {})
    options = dict(options or {})
    if reviewed is not None:
        options["reviewed"] = reviewed
    with collector.paused():
        start = time.perf_counter()
        read = dialect.read(model, policy)
        seconds["read"] = time.perf_counter() - start
        context = PassManager().run(PassContext(read.graph, policy, options))
    seconds["passes"] = sum(context.seconds.values())
    plan = context.plan(label)
    _log_decisions(plan)
    for message in context.warnings:
        warnings.warn(message, PolicyWarning, stacklevel=3)
    return Analysis(dialect, read, plan, context.script, seconds, list(context.warnings))


def convert(
    source: object,
    policy: Policy,
    *,
    dialect: Dialect | None = None,
    reviewed: Plan | None = None,
    options: dict[str, Any] | None = None,
    label: str | None = None,
) -> Conversion:
    """Analyse ``source`` and apply the edits: the converted model and its plan."""
    with collector.paused():  # one block: no full collection between analysing and applying
        analysis = analyse(
            source, policy, dialect=dialect, reviewed=reviewed, options=options, label=label
        )
        return apply(analysis)


def apply(analysis: Analysis) -> Conversion:
    start = time.perf_counter()
    with collector.paused():
        converted = analysis.dialect.apply(analysis.read, analysis.script)
        analysis.dialect.keep_plan(converted, analysis.plan)
    seconds = {**analysis.seconds, "apply": time.perf_counter() - start}
    log.info("converted in %.2f s", sum(seconds.values()))
    return Conversion(converted, analysis.plan, seconds, analysis.graph, analysis.script)


def range_options(ranges: object | None, tuned: object | None = None) -> dict[str, Any]:
    """The pass options for calibrated ranges (the ``range`` pass) and a tuned set of nodes
    kept float32 (the ``tuned`` pass); empty when neither is given."""
    options: dict[str, Any] = {}
    if ranges is not None:
        options["ranges"] = ranges
    if tuned:
        options["tuned"] = frozenset(tuned)  # type: ignore[arg-type]
    return options


def reviewed_policy(plan: Plan, where: str) -> Policy:
    """The policy a reviewed plan was made under (what applying it needs)."""
    if plan.dtype != plan.policy.get("dtype"):
        raise GraphampError(f"{where}: the plan's dtype and its policy's dtype differ")
    return Policy.from_record(plan.policy, where=where)


def _log_decisions(plan: Plan) -> None:
    """graphamp -vv: every decision, in graph order."""
    if not log.isEnabledFor(logging.DEBUG):
        return
    for name, decision in plan.nodes.items():
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
