"""``tune``: the fewest nodes to keep float32 so that a converted model meets a tolerance.

Plans are evaluated with the switchable model (:mod:`graphamp.onnx.numerics.switchable`): one
onnxruntime session that rounds like any plan's conversion under the faithful evaluator, so an
evaluation is one run per batch. A plan meets the tolerance when every output, on every batch,
has no inf/NaN the float32 model lacks and max |y - y32| / max |y32| <= rtol (or
max |y - y32| <= atol), as ``--verify`` measures.

1. Attribution: the float32 model runs beside the switchable one in one session, intermediate
   by intermediate (:class:`Attribution`, debug's ranking): the error each low node adds, and
   whether the plan meets the tolerance.
2. Overflow first, with no model run: a low op that reads or writes a value the float32 model
   holds beyond the type's range (the range rule, no margin) overflows; the first such op in
   graph order is kept, the plan decided again (deny spreads from it), and so on; the real
   conversion with them is checked at once (it is the last step anyway). Then, while a node
   still turns finite values into inf/NaN, keep every such node and attribute again (an inf
   hides every fault behind it, so each round can reveal the next).
3. When only finite errors remain over the tolerance: the suspects (the nodes where an error
   over rtol starts, in graph order, then the rest by the error they add), each followed by its
   producers (a cancelling node reads rounded inputs); the shortest prefix that meets the
   tolerance, reduced by delta debugging to a 1-minimal set (:mod:`graphamp.numerics.search`).
4. Convert with the nodes kept (rule ``tuned``: a deny seed, as the ``deny_names`` snippet
   printed) and check the real conversion with the faithful evaluator; should it miss the
   tolerance where the switchable model met it, the search runs again on real conversions.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx

from graphamp import engine
from graphamp.core.graph import OpGraph
from graphamp.numerics import verify
from graphamp.numerics.batches import DataSource, Feeds, as_batches
from graphamp.numerics.ranges import Ranges, TensorRange, range_decisions
from graphamp.numerics.search import find_kept
from graphamp.onnx.conversion import Conversion
from graphamp.onnx.dialect.plugin import OnnxDialect
from graphamp.onnx.io.files import inferred_types
from graphamp.onnx.numerics.calibration import functions_inlined
from graphamp.onnx.numerics.debugging import Comparison, DebugReport
from graphamp.onnx.numerics.debugging import report as debug_report
from graphamp.onnx.numerics.emulate import emulated, has_low_values
from graphamp.onnx.numerics.runtime import input_specs
from graphamp.onnx.numerics.session import Session, Weights, as_proto
from graphamp.onnx.numerics.statgraph import float32_values
from graphamp.onnx.numerics.switchable import Switchable
from graphamp.passes import PassContext, PassManager
from graphamp.passes.options import Options
from graphamp.passes.pipeline import DECIDING
from graphamp.passes.weights import WeightRanges
from graphamp.policy.policy import Policy


@dataclass
class TuneResult:
    """What :func:`tune` found: the conversion with the set kept float32 (rule ``tuned``)."""

    conversion: Conversion
    kept: tuple[str, ...]  # in the order of the error each node added, worst first
    met: bool  # whether the real conversion meets the tolerance
    evaluations: int  # plans evaluated with the switchable model
    real_evaluations: int  # conversions checked for real (at least the final one)
    seconds: float
    errors: dict[str, float]  # per graph output of the final conversion: max rel error
    baseline_errors: dict[str, float] = field(default_factory=dict)
    candidates: int = 0  # low nodes of the baseline the search could keep float32
    rounds: int = 0  # attribution runs (debug's ranking on the switchable model)

    def snippet(self) -> str:
        """The found set as a policy snippet (TOML)."""
        names = ", ".join(_toml_string(glob_escape(name)) for name in self.kept)
        return f"deny_names = [{names}]"


def tune(
    model: object,
    data: DataSource,
    *,
    rtol: float,
    atol: float = 0.0,
    policy: Policy | None = None,
    ranges: Ranges | None = None,
    options: Options | None = None,
) -> TuneResult:
    """Find the nodes to keep float32 (module docstring). ``model`` is a path or a model;
    ``data`` a DATA path, a dict of arrays or an iterable of them; ``options`` more pass
    options (``strict``); ``ranges`` and the kept set are tune's own."""
    start = time.perf_counter()
    proto = as_proto(model)
    policy = policy or Policy.create()
    batches = as_batches(data, input_specs(proto))
    options = dataclasses.replace(options or Options(), ranges=ranges)
    analysis = engine.analyse(proto, policy, dialect=OnnxDialect(), options=options)
    decide = Decider(analysis, policy, options)
    # the switchable model holds the float32 weights under their names, as does the comparison
    # model built on it: both sessions use one copy
    switch = Switchable(proto, analysis.graph, policy.dtype, Weights())
    baseline = decide(frozenset())
    candidates = [n for n in switch.switched if n in baseline]
    # a model-local function's ops are compared and ranked by call path, as the switchable
    # model switches them: both run the functions inlined
    attribute = Attribution(
        functions_inlined(proto) if proto.functions else proto, switch, rtol, atol
    )
    report, met, baseline_errors = attribute(batches, baseline)
    expected = attribute.expected  # the float32 outputs, from the reference copy
    answers: dict[frozenset[str], bool] = {frozenset(): met}

    def meets(kept: frozenset[str]) -> bool:
        if kept not in answers:
            low = decide(kept)
            answers[kept] = all(
                _within(want, switch.run(feeds, low), rtol, atol)
                for feeds, want in zip(batches, expected, strict=True)
            )
        return answers[kept]

    kept: list[str] = []
    checked: tuple[engine.Conversion, bool, dict[str, float]] | None = None
    real = 0
    if not met:  # values the float32 model holds beyond the type's range overflow: keep them
        kept = _overflowing(attribute.ranges(), analysis.graph, policy.dtype, decide)
        if kept:  # the real conversion is checked at the end anyway: check it now
            conversion = _convert(proto, policy, options, tuple(kept))
            checked = (conversion, *_check(conversion, batches, expected, rtol, atol))
            real, met = 1, checked[1]
            answers[frozenset(kept)] = met
            if not met:
                report, met, _ = attribute(batches, decide(frozenset(kept)))
    while not met:
        # Nodes that turn finite values into inf/NaN: each must stay float32, and what they
        # break hides every fault behind them: keep them, and look again.
        breaking = [
            n.name
            for n in report.nodes
            if math.isinf(n.error) and n.name in set(candidates) - set(kept)
        ]
        if not breaking:
            break
        kept += breaking
        report, met, _ = attribute(batches, decide(frozenset(kept)))
        answers[frozenset(kept)] = met
    if not met:  # finite errors only: search along the ranking
        pending = [n for n in candidates if n not in set(kept)]
        suspects = _suspects(report, analysis.graph, pending, rtol)
        ranked = _with_producers(suspects, analysis.graph, set(pending))
        ranked += [n for n in pending if n not in set(ranked)]
        fixed = frozenset(kept)
        found = find_kept(ranked, lambda more: meets(fixed | more))
        kept += found.kept
        met = found.met
    if checked is not None and checked[1]:
        final, real_met, errors = checked
    else:
        final = _convert(proto, policy, options, tuple(kept))
        real_met, errors = _check(final, batches, expected, rtol, atol)
        real += 1
    if met and not real_met:  # the switchable model disagreed: search again on real conversions

        def meets_real(candidate: frozenset[str]) -> bool:
            conversion = _convert(proto, policy, options, tuple(sorted(candidate)))
            return _check(conversion, batches, expected, rtol, atol)[0]

        found = find_kept(kept + [n for n in candidates if n not in set(kept)], meets_real)
        real += found.evaluations
        kept = list(found.kept)
        final = _convert(proto, policy, options, tuple(kept))
        real_met, errors = _check(final, batches, expected, rtol, atol)
    return TuneResult(
        Conversion(final.model, final.plan, final.seconds, final.graph),
        tuple(kept),
        real_met,
        len(answers),  # distinct plans evaluated, the attribution runs' among them
        real,
        time.perf_counter() - start,
        errors,
        baseline_errors,
        len(candidates),
        attribute.runs,
    )


class Attribution:
    """One run of the float32 model beside the switchable one, intermediate by intermediate:
    debug's ranking of the nodes by the error they add, and whether the outputs meet the
    tolerance, for any set of low nodes."""

    def __init__(self, proto: onnx.ModelProto, switch: Switchable, rtol: float, atol: float):
        self.switch, self.rtol, self.atol = switch, rtol, atol
        produced = {out for node in switch.proto.graph.node for out in node.output}
        tensors = [t for t in float32_values(proto) if t in produced]
        weights = frozenset(init.name for init in proto.graph.initializer)
        self.comparison = Comparison(
            proto, switch.proto, tensors, shared=weights, weights=switch.weights, fold=False
        )
        self.expected: list[dict[str, np.ndarray]] = []
        self.runs = 0
        self.stats: dict[str, dict[str, float]] = {}

    def ranges(self) -> Ranges:
        """The float32 model's largest magnitudes, from the last run's reference copy."""
        return Ranges(
            {t: TensorRange(stat["max_abs"], None) for t, stat in self.stats.items()}, batches=1
        )

    def __call__(
        self, batches: Iterable[Feeds], low: frozenset[str]
    ) -> tuple[DebugReport, bool, dict[str, float]]:
        """(the ranking, whether every batch meets the tolerance, each output's worst error)."""
        verdicts: list[bool] = []
        worst: dict[str, float] = {}
        first = not self.expected

        def on_batch(expected: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> None:
            if first:
                self.expected.append(expected)
            report = verify.compare(expected, got, rtol=self.rtol, atol=self.atol, provider="")
            verdicts.append(report.ok)
            for output in report.outputs:
                error = math.inf if output.nan_inf else output.max_rel_error
                worst[output.name] = max(worst.get(output.name, 0.0), error)

        stats, outputs = self.comparison.run(batches, self.switch.flags(low), on_batch)
        self.stats = stats
        self.runs += 1
        dtype = self.switch.dtype
        report = debug_report(
            self.comparison.reference,
            stats,
            outputs,
            lambda name: dtype if name in low else "float32",
            None,
            f"switchable model, {dtype} rounding emulated",
            len(verdicts),
        )
        return report, all(verdicts), worst


class Decider:
    """The low nodes of a plan with a set of nodes kept float32 (rule ``tuned``), from the
    deciding passes over the graph already read."""

    def __init__(self, analysis: engine.Analysis, policy: Policy, options: Options) -> None:
        self.graph = analysis.graph
        self.policy = policy
        self.options = options
        # the deciding passes convert runs (the casts pass is not needed to evaluate a plan)
        self.manager = PassManager(DECIDING, check=False)
        self.weights: WeightRanges | None = None
        self.known: dict[frozenset[str], frozenset[str]] = {}

    def __call__(self, kept: frozenset[str]) -> frozenset[str]:
        if kept not in self.known:
            self.known[kept] = self._decide(kept)
        return self.known[kept]

    def _decide(self, kept: frozenset[str]) -> frozenset[str]:
        options = dataclasses.replace(self.options, tuned=kept)
        context = PassContext(self.graph, self.policy, options)
        if self.weights is not None:  # stored values scanned once for every plan
            context.weights = self.weights
        self.weights = context.weights
        self.manager.run(context)
        low = self.policy.dtype
        return frozenset(n for n, d in context.decisions.items() if d.precision == low)


def _suspects(report: DebugReport, graph: OpGraph, pending: list[str], rtol: float) -> list[str]:
    """The nodes to try first, best first: those whose output's error crosses ``rtol`` while
    their inputs' errors do not (where an error starts; in graph order), then the others that
    add error, by the error they add. The nodes downstream of a fault inherit its error and
    may seem to add more (an error relative to a tensor's largest value grows where the values
    shrink), which is why where it starts comes first."""
    position = {name: index for index, name in enumerate(graph.nodes)}
    crossing = sorted(  # float32 ones too: their low producers follow them
        (n.name for n in report.nodes if n.output_error > rtol >= n.input_error),
        key=lambda name: position.get(name, len(position)),
    )
    adding = [n.name for n in report.nodes if n.error > 0 and n.name in set(pending)]
    return crossing + [name for name in adding if name not in set(crossing)]


def _with_producers(ranked: list[str], graph: OpGraph, allowed: set[str]) -> list[str]:
    """``ranked`` with, after each node, the producers of the values it computes from: a node
    that cancels (a - b with a close to b) adds the error, but keeping it float32 does not help
    while it reads a and b rounded; their producers are the next to try."""
    flow = graph.dataflow
    result: list[str] = []
    for name in ranked:
        for candidate in (name, *sorted(flow.predecessors(name))):
            if candidate in allowed and candidate not in result:
                result.append(candidate)
    return result


def _overflowing(ranges: Ranges, graph: OpGraph, dtype: str, decide: Decider) -> list[str]:
    """Nodes to keep so that no low op reads or writes a value that overflows ``dtype`` (the
    range rule with no margin), fewest first: the first such low node in graph order is kept,
    the plan decided again (deny spreads from it, which may settle its followers), and so on."""
    overflowing = set(range_decisions(ranges, graph, dtype, margin=1.0))
    order = [name for name in graph.nodes if name in overflowing]
    kept: list[str] = []
    while True:
        low = decide(frozenset(kept))
        first = next((name for name in order if name in low and name not in kept), None)
        if first is None:
            return kept
        kept.append(first)


def _convert(
    proto: onnx.ModelProto, policy: Policy, options: Options, kept: tuple[str, ...]
) -> engine.Conversion:
    options = dataclasses.replace(options, tuned=frozenset(kept))
    return engine.convert(proto, policy, dialect=OnnxDialect(), options=options)


def _outputs(conversion: engine.Conversion, batches: Iterable[Feeds]) -> list[Feeds]:
    """The converted model's outputs on every batch, by the faithful evaluator."""
    proto = as_proto(conversion.model)  # the converted proto (its weights read in)
    types = inferred_types(proto)
    weights = Weights()
    proto = emulated(proto, types, weights) if has_low_values(proto, types) else proto
    session = Session(proto, what="the converted model", weights=weights)
    return [session.run(feeds) for feeds in batches]


def _check(
    conversion: engine.Conversion,
    batches: Iterable[Feeds],
    expected: Iterable[Feeds],
    rtol: float,
    atol: float,
) -> tuple[bool, dict[str, float]]:
    """Whether ``conversion`` meets the tolerance on every batch, and per graph output the
    worst max |y - y32| / max |y32| (inf: a value finite in float32 is inf/NaN)."""
    met = True
    worst: dict[str, float] = {}
    for got, want in zip(_outputs(conversion, batches), expected, strict=True):
        report = verify.compare(want, got, rtol=rtol, atol=atol, provider="")
        met = met and report.ok
        for output in report.outputs:
            error = float("inf") if output.nan_inf else output.max_rel_error
            worst[output.name] = max(worst.get(output.name, 0.0), error)
    return met, worst


def _within(
    expected: dict[str, np.ndarray], got: dict[str, np.ndarray], rtol: float, atol: float
) -> bool:
    return verify.compare(expected, got, rtol=rtol, atol=atol, provider="").ok


def glob_escape(name: str) -> str:
    """``name`` as a deny_names glob that matches only itself."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _toml_string(text: str) -> str:
    """``text`` as a TOML basic string: a node name from the model, so a quote, a newline
    or an escape sequence in it is escaped, never printed raw into the snippet (TOML's
    ``\\uXXXX`` keeps the name the same when the snippet is read back)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    if not escaped.isprintable():
        escaped = "".join(c if c.isprintable() else _toml_escape(c) for c in escaped)
    return f'"{escaped}"'


def _toml_escape(char: str) -> str:
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
