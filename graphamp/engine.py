"""The engine: one conversion for every dialect.

read (the dialect) -> passes (the pass manager, over the neutral graph) -> plan (the record)
and edit script -> apply (the dialect). With ``reviewed=`` a reviewed plan's decisions are
applied instead of new ones, and a model that no longer matches the plan is refused.
:func:`convert_and_save` also writes the result, checking weights on disk as it writes them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphamp.core import collector
from graphamp.core.graph import OpGraph
from graphamp.dialects.base import Dialect, ReadGraph
from graphamp.dialects.registry import for_source
from graphamp.errors import GraphampError, PolicyWarning, WeightOverflow, warn
from graphamp.passes import PassContext, PassManager
from graphamp.passes.options import Options
from graphamp.passes.pipeline import MODEL
from graphamp.plans.edits import EditScript, Fp8Edits
from graphamp.plans.plan import Plan
from graphamp.policy.policy import Policy
from graphamp.training.float8 import Float8

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
    # convert_and_save: the weight on disk that overflowed while written, after which every
    # weight was checked before converting again (empty: none did)
    rechecked: str = ""


def analyse(
    source: object,
    policy: Policy,
    *,
    dialect: Dialect | None = None,
    reviewed: Plan | None = None,
    options: Options | None = None,
    label: str | None = None,
) -> Analysis:
    """Load ``source`` (a path or a model object), read it and run the passes."""
    dialect = dialect or for_source(source)
    seconds: dict[str, float] = {}
    with collector.paused(), _in_file(source):
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


@contextmanager
def _in_file(source: object) -> Iterator[None]:
    """An error about one of a model file's nodes ("node 'MatMul_3' (MatMul): ...", found
    where the dialect reads the graph, which holds no path) names the file, as the checks
    before it do."""
    try:
        yield
    except GraphampError as exc:
        if isinstance(source, str | Path) and str(exc).startswith("node "):
            raise GraphampError(f"{source}: {exc}") from exc.__cause__
        raise


def analyse_model(
    dialect: Dialect,
    model: Any,
    policy: Policy,
    *,
    reviewed: Plan | None = None,
    options: Options | None = None,
    label: str = "",
    seconds: dict[str, float] | None = None,
) -> Analysis:
    """Read a loaded ``model`` and run the passes over its graph."""
    seconds = dict(seconds or {})
    options = options or Options()
    if reviewed is not None:
        options = dataclasses.replace(options, reviewed=reviewed)
        if reviewed.fp8_settings is not None and options.fp8 is None:  # its float8 settings
            where = options.reviewed_where or reviewed.model or "the plan"
            fp8 = Float8.from_dict(reviewed.fp8_settings, where=where)
            options = dataclasses.replace(options, fp8=fp8)
    with collector.paused():
        start = time.perf_counter()
        read = dialect.read(model, policy)
        seconds["read"] = time.perf_counter() - start
        context = PassManager(MODEL).run(PassContext(read.graph, policy, options))
        if options.fp8 is not None:  # what the dialect writes of the fp8 pass's records
            context.script.fp8 = Fp8Edits(policy.dtype, list(context.scales))
    seconds["passes"] = sum(context.seconds.values())
    plan = context.plan(label)
    _log_decisions(plan)
    for message in context.warnings:
        warn(message, PolicyWarning)  # at the caller's line, however deep the call
    return Analysis(dialect, read, plan, context.script, seconds, list(context.warnings))


def convert(
    source: object,
    policy: Policy,
    *,
    dialect: Dialect | None = None,
    reviewed: Plan | None = None,
    options: Options | None = None,
    label: str | None = None,
) -> Conversion:
    """Analyse ``source`` and apply the edits: the converted model and its plan."""
    with collector.paused():  # one block: no full collection between analysing and applying
        analysis = analyse(
            source, policy, dialect=dialect, reviewed=reviewed, options=options, label=label
        )
        return apply(analysis)


def convert_and_save(
    source: Path,
    target: Path,
    policy: Policy,
    *,
    dialect: Dialect | None = None,
    reviewed: Plan | None = None,
    options: Options | None = None,
) -> Conversion:
    """Convert the file ``source`` and write the result to ``target`` (the input's own bytes
    where nothing changed and the dialect can copy them).

    Weights on disk are not read before converting (``Options.speculate_weights``): the
    writer range-checks each one as it converts it, and the ``speculation_check`` pass
    measures those no writer will convert. Should one overflow, nothing of that attempt is
    kept, and the conversion starts over with every weight checked first, so that weight's
    readers stay float32 as they always would (``Conversion.rechecked`` names it). With a
    reviewed plan nothing is deferred: the plan is compared with the analysis, counts
    included."""
    dialect = dialect or for_source(source)
    options = options or Options()
    speculate = reviewed is None
    try:
        return _convert_and_save(source, target, policy, dialect, reviewed, options, speculate)
    except WeightOverflow as miss:
        if not speculate:
            raise
        conversion = _convert_and_save(source, target, policy, dialect, reviewed, options, False)
        return dataclasses.replace(conversion, rechecked=miss.weight)


def _convert_and_save(
    source: Path,
    target: Path,
    policy: Policy,
    dialect: Dialect,
    reviewed: Plan | None,
    options: Options,
    speculate: bool,
) -> Conversion:
    options = dataclasses.replace(options, speculate_weights=speculate)
    result = convert(source, policy, dialect=dialect, reviewed=reviewed, options=options)
    unchanged = result.script is not None and result.script.empty
    if not (unchanged and dialect.save_unchanged(source, target)):
        dialect.save(result.model, target)
    return result


def apply(analysis: Analysis) -> Conversion:
    start = time.perf_counter()
    with collector.paused():
        converted = analysis.dialect.apply(analysis.read, analysis.script)
        analysis.dialect.keep_plan(converted, analysis.plan)
    seconds = {**analysis.seconds, "apply": time.perf_counter() - start}
    log.info("converted in %.2f s", sum(seconds.values()))
    return Conversion(converted, analysis.plan, seconds, analysis.graph, analysis.script)


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
