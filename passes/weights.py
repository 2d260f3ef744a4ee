"""The value ranges of stored weights, scanned once and shared by every pass.

classify asks whether a weight's values would overflow the target type (its reader then stays
float32: weights are never silently clamped); the casts pass asks how many values overflow and
how many flush to zero, for the plan. Each weight is read once, when first asked about, in
chunks, so the temporaries stay small however large the tensor; a dialect whose weights stay on
disk hands over a memory map, dropped when its scan is done. The scan is reported to
:mod:`graphamp.core.progress` (a bar on a terminal: it reads every byte of the weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphamp.core import progress
from graphamp.core.dtypes import FLOAT_TYPES, itemsize
from graphamp.core.graph import OpGraph
from graphamp.passes.numerics import at_limit_count, count_flushed, overflow_threshold

# Elements per chunk: 4 MiB of float32, so the comparison temporaries stay in the CPU's cache
# (larger chunks spill them to memory).
CHUNK = 1 << 20


@dataclass(frozen=True)
class WeightStats:
    """One stored value measured against a target type."""

    elements: int
    absmax: float  # the largest finite magnitude (0 for an empty or all-infinite tensor)
    beyond: int  # finite values at or beyond the target's overflow threshold, but for:
    flushed: int  # non-zero values that round to zero in the target
    # values exactly at float32's lowest/highest: a mask's stand-in for infinity, stored at
    # half the target's largest (numerics.FLOAT32_LIMIT), so they do not keep readers float32
    at_limit: int = 0
    # not read: the conversion checks the values as it writes them (WeightRanges speculate)
    deferred: bool = False

    @property
    def overflows(self) -> bool:
        return self.beyond > 0


class WeightRanges:
    """Lazily measured :class:`WeightStats` of a graph's stored values for one target type.

    With ``speculate``, a value stored on disk is not read at all: it is assumed to fit, and
    its stats say ``deferred``. Only a conversion that writes every such value may ask for this
    (``graphamp convert``): its writer checks each chunk as it rounds it, counts what flushed,
    and raises :class:`~graphamp.errors.WeightOverflow` on a value the target cannot hold, after
    which the conversion starts over without speculating. A model larger than memory is then
    read from disk once instead of twice (once to check, once to convert).
    """

    def __init__(self, graph: OpGraph, target: str, *, speculate: bool = False) -> None:
        self.graph = graph
        self.target = target
        self.speculate = speculate
        self._stats: dict[tuple[str, str], WeightStats] = {}
        self._reported = False

    def stats(self, name: str, target: str | None = None) -> WeightStats:
        """The stats of stored value ``name`` against ``target`` (default: the policy's)."""
        target = target or self.target
        key = (name, target)
        tensor = self.graph.tensors[name]
        if key not in self._stats and self.speculate and tensor.on_disk:
            elements = math.prod(d if isinstance(d, int) else 0 for d in tensor.shape or ())
            self._stats[key] = WeightStats(elements, 0.0, 0, 0, deferred=True)
        if key not in self._stats:
            self._begin_report()
            progress.current().advance(self._measure(name, target))
        return self._stats[key]

    def check_deferred(self, converted: set[str]) -> str | None:
        """Measure the deferred values that will not be converted (nothing will check them
        while writing) and return the first that overflows the target, or None. With this,
        every assumption ``speculate`` made is checked: such a value read only by float32 ops
        still decides its readers' rule (``weight_range``) and the plan's kept weights."""
        deferred = [
            name
            for (name, target), stats in self._stats.items()
            if stats.deferred and target == self.target and name not in converted
        ]
        for name in deferred:
            self._measure(name, self.target)
            if self._stats[(name, self.target)].overflows:
                return name
        return None

    def _measure(self, name: str, target: str) -> int:
        """Read and measure ``name`` against ``target`` (replacing deferred stats); the bytes
        read."""
        values = np.asarray(self.graph.tensors[name].stored_value())
        self._stats[(name, target)] = measure(values, target)
        return values.nbytes

    def _begin_report(self) -> None:
        """Start the progress phase at the first scan: its total is every stored float value
        (some may never be asked about; the phase ends complete all the same)."""
        if self._reported:
            return
        self._reported = True
        stored = [
            t
            for t in self.graph.tensors.values()
            if t.is_constant
            and t.dtype in FLOAT_TYPES
            and t.shape is not None
            and not (self.speculate and t.on_disk)
        ]
        total = sum(
            math.prod(d if isinstance(d, int) else 0 for d in t.shape or ()) * itemsize(t.dtype)
            for t in stored
        )
        progress.current().begin("checking weight ranges", total, len(stored))


def measure(values: np.ndarray, target: str) -> WeightStats:
    """Scan ``values`` chunk by chunk against ``target``."""
    limit = overflow_threshold(target)
    flat = values.reshape(-1)
    absmax, beyond, flushed, at_limit = 0.0, 0, 0, 0
    for start in range(0, flat.size, CHUNK):
        chunk = flat[start : start + CHUNK]
        largest = max(float(chunk.max()), -float(chunk.min()))  # no |chunk| temporary
        if not np.isfinite(largest):
            magnitudes = np.abs(chunk)
            finite = magnitudes[np.isfinite(magnitudes)]
            largest = float(finite.max()) if finite.size else 0.0
        absmax = max(absmax, largest)
        if largest >= limit:
            sentinels = at_limit_count(chunk)
            at_limit += sentinels
            beyond += int(np.count_nonzero(np.isfinite(chunk) & (np.abs(chunk) >= limit)))
            beyond -= sentinels
        flushed += count_flushed(chunk, target)
    return WeightStats(int(flat.size), absmax, beyond, flushed, at_limit)
