"""``graphamp tune --fp8``: the fewest float8 nodes to keep in the low type so that a float8
conversion meets a tolerance.

Plain ``tune`` switches nodes between float32 and the low type inside one switchable model;
float8's quantisers and float8 weights are not such a switch, so this search converts for real
and measures each candidate through the faithful evaluator. The search:

1. Convert with float8 everywhere the rules allow; done when it meets the tolerance.
2. Keep every float8 node in the low type: when even that misses, float8 is not the cause
   (the low type is: run ``tune`` without ``--fp8``), and nothing is written.
3. Rank the float8 nodes by the error each adds (as ``graphamp debug`` ranks nodes), worst
   first; keep the shortest ranked prefix that meets the tolerance (found by bisection), then
   drop each kept node whose float8 the tolerance still allows (latest first).

The kept nodes become ``deny_names`` of the float8 settings (rule ``fp8_deny`` in the plan),
printed as ``--fp8-deny-names`` for the command line.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import onnx

from graphamp.numerics import verify
from graphamp.numerics.batches import DataSource, as_batches
from graphamp.numerics.ranges import Ranges
from graphamp.onnx.conversion import Conversion
from graphamp.onnx.numerics.runtime import input_specs, run
from graphamp.onnx.numerics.session import as_proto
from graphamp.onnx.numerics.tuning import glob_escape
from graphamp.policy.policy import Policy
from graphamp.training.float8 import Float8


@dataclass
class Fp8TuneResult:
    """The conversion with ``kept`` out of float8, and how the search went."""

    conversion: Conversion
    kept: tuple[str, ...]  # worst first
    met: bool
    evaluations: int  # conversions measured
    seconds: float
    errors: dict[str, float]  # per graph output of the final conversion: max rel error
    baseline_errors: dict[str, float]
    candidates: int  # float8 nodes of the first conversion

    def snippet(self) -> str:
        return "--fp8-deny-names " + " ".join(f"'{glob_escape(name)}'" for name in self.kept)


def tune_fp8(
    model: object,
    data: DataSource,
    *,
    rtol: float,
    atol: float = 0.0,
    policy: Policy | None = None,
    ranges: Ranges,
    fp8: Float8 | None = None,
) -> Fp8TuneResult:
    """Find the float8 nodes to keep in the low type (module docstring)."""
    import graphamp.onnx as gonnx

    start = time.perf_counter()
    proto = as_proto(model)
    policy = policy or Policy.create()
    settings = fp8 or Float8.static()
    batches = list(as_batches(data, input_specs(proto)))
    expected = [run(proto, feeds)[0] for feeds in batches]
    evaluations = 0

    def convert(kept: tuple[str, ...]) -> tuple[Conversion, dict[str, float], bool]:
        nonlocal evaluations
        evaluations += 1
        globs = tuple(glob_escape(name) for name in kept)
        denied = dataclasses.replace(settings, deny_names=(*settings.deny_names, *globs))
        conversion = gonnx.convert(proto, policy, fp8=denied, ranges=ranges)
        converted = conversion.to_proto()
        errors: dict[str, float] = {}
        met = True
        for want, feeds in zip(expected, batches, strict=True):
            got, _ = run(converted, feeds)
            met &= verify.compare(want, got, rtol=rtol, atol=atol, provider="").ok
            for name, value in want.items():
                scale = float(np.abs(value).max()) or 1.0
                error = float(np.abs(np.asarray(got[name], np.float64) - value).max()) / scale
                errors[name] = max(errors.get(name, 0.0), error)
        return conversion, errors, met

    first, baseline, met = convert(())
    chosen = [name for name, d in first.plan.fp8.items() if d.rule == "fp8"]

    def result(
        conversion: Conversion, kept: tuple[str, ...], errors: dict[str, float], ok: bool
    ) -> Fp8TuneResult:
        seconds = time.perf_counter() - start
        return Fp8TuneResult(
            conversion, kept, ok, evaluations, seconds, errors, baseline, len(chosen)
        )

    def meets(kept: tuple[str, ...]) -> bool:
        return convert(kept)[2]

    if met:
        return result(first, (), baseline, True)
    everything, errors, met = convert(tuple(chosen))
    if not met:
        return result(everything, tuple(chosen), errors, False)
    ranked = _ranked(proto, first, batches[:1], chosen)
    low, high = 0, len(ranked)  # the shortest prefix that meets: in (low, high]
    while high - low > 1:
        middle = (low + high) // 2
        if meets(tuple(ranked[:middle])):
            high = middle
        else:
            low = middle
    kept = list(ranked[:high])
    for name in reversed(ranked[:high]):  # drop what the tolerance still allows in float8
        trial = tuple(n for n in kept if n != name)
        if meets(trial):
            kept = list(trial)
    final, errors, met = convert(tuple(kept))
    return result(final, tuple(kept), errors, met)


def _ranked(
    proto: onnx.ModelProto, conversion: Conversion, batches: list[dict], chosen: list[str]
) -> list[str]:
    """``chosen`` ranked by the error each adds in ``conversion`` (worst first)."""
    from graphamp.onnx.numerics.debugging import debug

    report = debug(proto, conversion.to_proto(), batches, plan=conversion.plan)
    added = {node.name: node.error for node in report.nodes}
    return sorted(chosen, key=lambda name: (-added.get(name, 0.0), name))
