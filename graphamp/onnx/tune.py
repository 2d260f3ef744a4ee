"""``tune``: the fewest nodes to keep float32 so that a converted model meets a tolerance.

1. Convert under the policy (and calibrated ranges, when given): the baseline.
2. Evaluate plans with the switchable model (:mod:`graphamp.onnx.switchable`): one onnxruntime
   session that rounds like any plan's conversion, so an evaluation is one run per batch. A
   plan meets the tolerance when every output, on every batch, has no inf/NaN the float32
   model lacks and max |y - y32| / max |y32| <= rtol (or max |y - y32| <= atol), as
   ``--verify`` measures.
3. When the baseline misses it: rank its low nodes by the error each adds
   (:mod:`graphamp.onnx.debugging`), and search (:mod:`graphamp.search`): the shortest ranked
   prefix that meets the tolerance, reduced by delta debugging to a 1-minimal set. A node kept
   float32 counts as a ``deny_names`` rule (deny spreads from it).
4. Convert with that set (rule ``tuned``) and check the real conversion, run by the faithful
   evaluator; should it miss the tolerance where the switchable model met it, the search runs
   again on real conversions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import onnx

from graphamp import engine, verify
from graphamp.batches import DataSource, as_batches
from graphamp.onnx.conversion import Conversion
from graphamp.onnx.debugging import debug
from graphamp.onnx.dialect import OnnxDialect
from graphamp.onnx.emulate import emulated, has_low_values
from graphamp.onnx.files import inferred_types
from graphamp.onnx.runtime import input_specs
from graphamp.onnx.session import Session, as_proto
from graphamp.onnx.switchable import Switchable
from graphamp.passes import PassContext, PassManager
from graphamp.passes.base import registered
from graphamp.policy import Policy
from graphamp.ranges import Ranges
from graphamp.search import find_kept

# The passes that decide precisions (the casts pass is not needed to evaluate a plan).
_DECIDING = ("policy_check", "classify", "range", "tuned", "paint", "promote")


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

    def snippet(self) -> str:
        """The found set as a policy snippet (TOML)."""
        names = ", ".join(_toml_string(_glob_escape(name)) for name in self.kept)
        return f"deny_names = [{names}]"


def tune(
    model: object,
    data: DataSource,
    *,
    rtol: float,
    atol: float = 0.0,
    policy: Policy | None = None,
    ranges: Ranges | None = None,
    options: dict[str, object] | None = None,
) -> TuneResult:
    """Find the nodes to keep float32 (module docstring). ``model`` is a path or a model;
    ``data`` a DATA path, a dict of arrays or an iterable of them; ``options`` more pass
    options (``strict``)."""
    start = time.perf_counter()
    proto = as_proto(model)
    policy = policy or Policy.create()
    batches = as_batches(data, input_specs(proto))
    reference = Session(proto, what="the float32 model")
    expected = [reference.run(feeds) for feeds in batches]
    extra = dict(options or {})
    analysis = engine.analyse(
        proto, policy, dialect=OnnxDialect(), options={**extra, **engine.range_options(ranges)}
    )
    decide = Decider(analysis, policy, ranges)
    switch = Switchable(proto, analysis.graph, policy.dtype)
    answers: dict[frozenset[str], bool] = {}

    def meets(kept: frozenset[str]) -> bool:
        if kept not in answers:
            low = decide(kept)
            answers[kept] = all(
                _within(want, switch.run(feeds, low), rtol, atol)
                for feeds, want in zip(batches, expected, strict=True)
            )
        return answers[kept]

    baseline = engine.apply(analysis)
    met, baseline_errors = _check(baseline, batches, expected, rtol, atol)
    candidates = [n for n in switch.switched if n in decide(frozenset())]
    final, errors, kept, real = baseline, baseline_errors, (), 1
    if not met:
        ranked = _ranked(proto, baseline, batches, candidates)
        kept = find_kept(ranked, meets).kept
        final = _convert(proto, policy, ranges, kept)
        met, errors = _check(final, batches, expected, rtol, atol)
        real += 1
        if not met:  # the switchable model disagreed: search again on real conversions

            def meets_real(candidate: frozenset[str]) -> bool:
                conversion = _convert(proto, policy, ranges, tuple(sorted(candidate)))
                return _check(conversion, batches, expected, rtol, atol)[0]

            found = find_kept(ranked, meets_real)
            real += found.evaluations
            kept = found.kept
            final = _convert(proto, policy, ranges, kept)
            met, errors = _check(final, batches, expected, rtol, atol)
    return TuneResult(
        Conversion(final.model, final.plan, final.seconds, final.graph),
        kept,
        met,
        len(answers),
        real,
        time.perf_counter() - start,
        errors,
        baseline_errors,
        len(candidates),
    )


class Decider:
    """The low nodes of a plan with a set of nodes kept float32 (rule ``tuned``), from the
    deciding passes over the graph already read."""

    def __init__(self, analysis: engine.Analysis, policy: Policy, ranges: Ranges | None) -> None:
        self.graph = analysis.graph
        self.policy = policy
        self.ranges = ranges
        self.passes = [cls for cls in registered() if cls.name in _DECIDING]
        self.weights = None

    def __call__(self, kept: frozenset[str]) -> frozenset[str]:
        options = engine.range_options(self.ranges, kept)
        context = PassContext(self.graph, self.policy, options)
        if self.weights is not None:  # stored values scanned once for every plan
            context.weights = self.weights
        self.weights = context.weights
        PassManager(self.passes, check=False).run(context)
        low = self.policy.dtype
        return frozenset(n for n, d in context.decisions.items() if d.precision == low)


def _ranked(
    proto: onnx.ModelProto, baseline: engine.Conversion, batches, candidates: list[str]
) -> list[str]:  # type: ignore[no-untyped-def]
    """``candidates`` ranked by the error each adds in the baseline, worst first; those that
    add none follow in graph order."""
    report = debug(proto, _proto(baseline), batches, plan=baseline.plan)
    allowed = set(candidates)
    ranked = [n.name for n in report.nodes if n.name in allowed and n.error > 0]
    return ranked + [n for n in candidates if n not in set(ranked)]


def _convert(
    proto: onnx.ModelProto, policy: Policy, ranges: Ranges | None, kept: tuple[str, ...]
) -> engine.Conversion:
    options = engine.range_options(ranges, kept)
    return engine.convert(proto, policy, dialect=OnnxDialect(), options=options)


def _proto(conversion: engine.Conversion) -> onnx.ModelProto:
    import onnx_ir as ir

    return ir.to_proto(conversion.model)


def _outputs(conversion: engine.Conversion, batches) -> list[dict[str, np.ndarray]]:  # type: ignore[no-untyped-def]
    """The converted model's outputs on every batch, by the faithful evaluator."""
    proto = _proto(conversion)
    types = inferred_types(proto)
    if has_low_values(proto, types):
        proto = emulated(proto, types)
    session = Session(proto, what="the converted model")
    return [session.run(feeds) for feeds in batches]


def _check(
    conversion: engine.Conversion, batches, expected, rtol: float, atol: float
) -> tuple[bool, dict[str, float]]:  # type: ignore[no-untyped-def]
    """Whether ``conversion`` meets the tolerance on every batch, and per graph output the
    worst max |y - y32| / max |y32| (inf: a value finite in float32 is inf/NaN)."""
    met, worst = True, {}
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


def _glob_escape(name: str) -> str:
    """``name`` as a deny_names glob that matches only itself."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _toml_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
