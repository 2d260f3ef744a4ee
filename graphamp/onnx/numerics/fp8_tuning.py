"""``graphamp tune --fp8``: the fewest float8 nodes to keep in the low type so that a float8
conversion meets a tolerance.

Every candidate set is evaluated in one float8 switchable model
(:mod:`graphamp.onnx.numerics.fp8_switchable`), built once from the conversion with float8
everywhere the rules allow: a set costs one run per batch (stopping at the first batch that
misses), not a conversion, an emulation and a session per batch. The search:

1. The float32 outputs of every batch, once. Float8 everywhere the rules allow: done when it
   meets the tolerance. Every candidate in the low type: when even that misses, float8 is not
   the cause (the low type is: run ``tune`` without ``--fp8``), and nothing is written.
2. Rank the candidates by the error each adds alone (every other candidate in the low type),
   worst first: the error of the outputs against float32 on the first batch, one run per
   candidate. A product's own float8 error is much the same everywhere (E4M3's rounding is
   relative); what differs is how much of it the rest of the model passes on (a query's or
   key's passes through a softmax, an output projection's straight into the residual stream),
   which only a run to the outputs measures.
3. The shortest ranked prefix that meets the tolerance (by bisection), then each of its nodes
   tried back in float8, smallest error alone first, while its error alone fits the margin
   left (:func:`_reduced`): the set is not proven 1-minimal, but a node the margin cannot
   hold costs no run. A deep model whose error is many products' small errors keeps most of
   them, and delta debugging would spend a run on each of many misses.
4. The real conversion with the kept nodes' rule ``fp8_tuned`` (the reason: the prefix that
   met and the one that missed, the node's error alone and its rank), checked by the faithful
   evaluator on every batch. Should it miss where the switchable model met (its products read
   weights through a ``Where``, the real ones stored weights, and a last-bit difference can
   flip a float8 rounding at a boundary), the next products by rank are kept too, up to
   ``_MORE``, each checked for real.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from graphamp import engine
from graphamp.numerics import verify
from graphamp.numerics.batches import DataSource, as_batches
from graphamp.numerics.ranges import Ranges
from graphamp.onnx.conversion import Conversion
from graphamp.onnx.dialect.plugin import OnnxDialect
from graphamp.onnx.numerics.fp8_switchable import Fp8Switchable
from graphamp.onnx.numerics.runtime import input_specs, runner
from graphamp.onnx.numerics.session import as_proto
from graphamp.onnx.numerics.tuning import glob_escape
from graphamp.passes.options import Options
from graphamp.policy.policy import Policy
from graphamp.training.float8 import Float8

Outputs = dict[str, np.ndarray]


@dataclass
class Fp8TuneResult:
    """The conversion with ``kept`` out of float8 (rule ``fp8_tuned``), and how the search
    went."""

    conversion: Conversion
    kept: tuple[str, ...]  # worst first
    met: bool  # whether the real conversion meets the tolerance
    evaluations: int  # candidate sets evaluated on every batch (or until one missed)
    runs: int  # batches run through the switchable model (the ranking's included)
    seconds: float
    errors: dict[str, float]  # per graph output of the final conversion: max rel error
    baseline_errors: dict[str, float]  # the same with every candidate in float8
    candidates: int  # float8 nodes of the first conversion
    alone: dict[str, float]  # each candidate's error alone (the ranking)

    def snippet(self) -> str:
        return "--fp8-deny-names " + " ".join(_quoted(glob_escape(name)) for name in self.kept)


def _quoted(word: str) -> str:
    """``word`` in single quotes for a shell: a quote in a node name (from the model) must not
    end the word and run what follows it when the snippet is pasted."""
    return "'" + word.replace("'", "'\"'\"'") + "'"


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
    start = time.perf_counter()
    proto = as_proto(model)
    policy = policy or Policy.create()
    settings = fp8 or Float8.static()
    batches = list(as_batches(data, input_specs(proto)))
    evaluate, _ = runner(proto)
    expected = [evaluate(feeds) for feeds in batches]
    del evaluate  # the float32 session's memory
    first = _convert(proto, policy, settings, ranges, {})
    chosen = [name for name, d in first.plan.fp8.items() if d.rule == "fp8"]
    search = _Search(first, proto, chosen, policy.dtype, batches, expected, rtol, atol)
    baseline = search.errors(chosen)

    def result(
        kept: Sequence[str],
        conversion: Conversion,
        alone: dict[str, float],
        checked: tuple[dict[str, float], bool] | None = None,
    ) -> Fp8TuneResult:
        errors, met = checked or _checked(conversion, batches, expected, rtol, atol)
        seconds = time.perf_counter() - start
        return Fp8TuneResult(
            conversion, tuple(kept), met, len(search.known), search.switch.runs, seconds,
            errors, baseline, len(chosen), alone,
        )  # fmt: skip

    if search.meets(frozenset()):
        return result((), first, {})
    if not search.meets(frozenset(chosen)):  # the low type alone misses: nothing to tune
        reasons = dict.fromkeys(
            chosen, f"kept {policy.dtype}: the model misses rtol {rtol:g} even with no float8"
        )
        return result(chosen, _convert(proto, policy, settings, ranges, reasons), {})
    alone = {name: search.worst([name], 1) for name in chosen}
    ranked = sorted(chosen, key=lambda name: (-alone[name], name))
    prefix = _shortest_prefix(ranked, search.meets)
    kept = _reduced(ranked[:prefix], alone, search, rtol)
    settled = (
        f"kept {policy.dtype} by graphamp tune --fp8 (rtol {rtol:g}, atol {atol:g}, "
        f"{len(batches)} batches): keeping the {prefix} products of largest error alone meets "
        f"the tolerance, " + (f"the {prefix - 1} largest miss it" if prefix > 1 else "none misses")
    )
    reasons = {name: _reason(settled, name, alone, ranked) for name in kept}
    final = _convert(proto, policy, settings, ranges, reasons)
    checked = _checked(final, batches, expected, rtol, atol)
    # The switchable model's products read their weights through a Where, the real model's
    # read stored ones: onnxruntime's arithmetic may differ in the last bits, and a float8
    # rounding near a boundary flips with them. Where that tips the real conversion over the
    # tolerance, the next products by rank are kept too, each checked for real.
    pending = [name for name in ranked if name not in kept][:_MORE]
    while not checked[1] and pending:
        name = pending.pop(0)
        kept.append(name)
        reasons[name] = _reason(
            f"kept {policy.dtype} by graphamp tune --fp8 (rtol {rtol:g}, atol {atol:g}, "
            f"{len(batches)} batches): the real conversion missed the tolerance the "
            "switchable model met; the next product by error alone",
            name, alone, ranked,
        )  # fmt: skip
        final = _convert(proto, policy, settings, ranges, reasons)
        checked = _checked(final, batches, expected, rtol, atol)
    return result(kept, final, alone, checked)


_MORE = 4  # products kept past the search's set when the real conversion misses


def _reason(settled: str, name: str, alone: dict[str, float], ranked: list[str]) -> str:
    return (
        f"{settled}; alone in float8 it puts the outputs {alone[name]:.3g} from float32 "
        f"(max |y - y32| / max |y32|, first batch), rank {ranked.index(name) + 1} of "
        f"{len(ranked)}"
    )


class _Search:
    """The candidate sets' answers, from one float8 switchable model; each set is run once
    and its answer cached."""

    def __init__(
        self,
        conversion: Conversion,
        source: onnx.ModelProto,
        chosen: list[str],
        dtype: str,
        batches: list[Outputs],
        expected: list[Outputs],
        rtol: float,
        atol: float,
    ) -> None:
        kept_int8 = bool((conversion.plan.fp8_settings or {}).get("kept_int8"))
        self.switch = Fp8Switchable(
            conversion.to_proto(), source, conversion.graph, chosen, dtype, kept_int8=kept_int8
        )
        self.chosen, self.rtol, self.atol = chosen, rtol, atol
        self.pairs = list(zip(batches, expected, strict=True))
        self.order = list(range(len(self.pairs)))  # meets() tries the batch that missed first
        self.known: dict[frozenset[str], bool] = {}
        self._worst: dict[tuple[frozenset[str], int], float] = {}

    def errors(self, float8: Sequence[str], count: int | None = None) -> dict[str, float]:
        """Per graph output, the worst error over the first ``count`` batches (every batch
        by default) with ``float8`` in float8 and the other candidates in the low type."""
        worst: dict[str, float] = {}
        met = True
        for feeds, want in self.pairs[:count]:
            report = self._compare(want, self.switch.run(feeds, float8))
            met = met and report.ok
            for output in report.outputs:
                error = float("inf") if output.nan_inf else output.max_rel_error
                worst[output.name] = max(worst.get(output.name, 0.0), error)
        if count is None or count >= len(self.pairs):  # every batch: meets() knows it too
            self.known[frozenset(n for n in self.chosen if n not in set(float8))] = met
        return worst

    def worst(self, float8: Sequence[str], count: int | None = None) -> float:
        """The largest of :meth:`errors` (cached)."""
        key = (frozenset(float8), count or len(self.pairs))
        if key not in self._worst:
            self._worst[key] = max(self.errors(float8, count).values())
        return self._worst[key]

    def meets(self, kept: frozenset[str]) -> bool:
        """Whether the model meets the tolerance on every batch with ``kept`` in the low type
        and the other candidates in float8: it stops at the first batch that misses, which
        later sets try first."""
        if kept not in self.known:
            float8 = [name for name in self.chosen if name not in kept]
            met = True
            for index in self.order:
                feeds, want = self.pairs[index]
                if not self._compare(want, self.switch.run(feeds, float8)).ok:
                    met = False
                    self.order.remove(index)
                    self.order.insert(0, index)
                    break
            self.known[kept] = met
        return self.known[kept]

    def _compare(self, want: Outputs, got: Outputs) -> verify.Report:
        return verify.compare(want, got, rtol=self.rtol, atol=self.atol, provider="")


def _shortest_prefix(ranked: list[str], meets: Callable[[frozenset[str]], bool]) -> int:
    """The smallest k such that keeping ``ranked[:k]`` meets the tolerance, by bisection
    (keeping none misses, keeping all meets: checked before)."""
    failing, passing = 0, len(ranked)
    while passing - failing > 1:
        middle = (failing + passing) // 2
        if meets(frozenset(ranked[:middle])):
            passing = middle
        else:
            failing = middle
    return passing


def _reduced(kept: list[str], alone: dict[str, float], search: _Search, rtol: float) -> list[str]:
    """``kept`` (which meets the tolerance) without each node that can go back to float8,
    smallest error alone first. Only a node whose error alone fits the margin left is tried:
    independent rounding errors add in quadrature, so sqrt(e**2 + a**2) <= rtol, with e the
    error with ``kept`` in the low type and a the node's error alone, is the prediction that it
    may fit; each try is a run. Many nodes of small errors (a deep model's products) would
    otherwise cost a run each, almost all of them misses."""
    error = search.worst([n for n in search.chosen if n not in kept])
    for name in sorted(kept, key=lambda n: (alone[n], n)):
        if math.hypot(error, alone[name]) > rtol:
            break  # the rest have larger errors alone
        trial = [n for n in kept if n != name]
        if search.meets(frozenset(trial)):
            kept = trial
            error = search.worst([n for n in search.chosen if n not in kept])
    return kept


def _convert(
    proto: onnx.ModelProto,
    policy: Policy,
    settings: Float8,
    ranges: Ranges,
    kept: dict[str, str],
) -> Conversion:
    options = Options(ranges=ranges, fp8=settings, fp8_tuned=kept)
    done = engine.convert(proto, policy, dialect=OnnxDialect(), options=options)
    return Conversion(done.model, done.plan, done.seconds, done.graph)


def _checked(
    conversion: Conversion, batches: list[Outputs], expected: list[Outputs], rtol: float,
    atol: float,
) -> tuple[dict[str, float], bool]:  # fmt: skip
    """The real conversion through the faithful evaluator: per graph output the worst
    max |y - y32| / max |y32| over every batch, and whether every batch meets the
    tolerance."""
    evaluate, _ = runner(conversion.to_proto())
    worst: dict[str, float] = {}
    met = True
    for feeds, want in zip(batches, expected, strict=True):
        report = verify.compare(want, evaluate(feeds), rtol=rtol, atol=atol, provider="")
        met = met and report.ok
        for output in report.outputs:
            error = float("inf") if output.nan_inf else output.max_rel_error
            worst[output.name] = max(worst.get(output.name, 0.0), error)
    return worst, met
