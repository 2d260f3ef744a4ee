"""Value ranges from data, and the ``range`` rule: which ops must stay float32 because the
values they read or write would leave the target type's range.

:class:`Ranges` is plain data keyed by tensor name (what ``graphamp.onnx.calibrate`` records
by running the float32 model on calibration data): per tensor its largest finite magnitude,
its smallest non-zero magnitude and how many elements were already inf/NaN in float32. It
serialises to stable JSON. :func:`range_decisions` is the rule a ``range`` pass applies; like
every pass it reads only the neutral :class:`~graphamp.core.graph.OpGraph`.

The rule, for a target type T, over every op that has computation-type slots: when a value in
one of those slots (an input or an output) reached a magnitude above T's limit on the data,
the op stays float32, and the reason names the value and its magnitude. The limits:

* float16: 65504 / 2 = 32752. Calibration data are a sample; the margin of 2 (one binade)
  keeps an op whose values came within a factor of two of float16's largest value, since data
  a little larger than the sample's would overflow it.
* bfloat16: what bfloat16 cannot hold (magnitudes that round to infinity, from about
  3.3961e38: float32's largest values, such as a ``finfo(float32).min`` mask). bfloat16 has
  float32's exponent range, so no margin is needed.

The smallest non-zero magnitude is recorded but decides nothing: flushing a tensor's smallest
values to zero rarely matters, and most tensors have some.

Where asked (float8, whose range is narrow), a tensor also records a histogram of its non-zero
finite magnitudes by binade, ``log2_counts``: how many elements had ``2**e <= |x| < 2**(e+1)``,
by ``e``. :func:`underflow_share` reads it: the share of those elements that would flush to
zero at a given scale (the ``fp8_range`` rule of :mod:`graphamp.passes.fp8`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from graphamp.core.dtypes import numpy_type
from graphamp.core.graph import NodeKind, OpGraph
from graphamp.core.io import write_atomic
from graphamp.errors import GraphampError

RANGES_FORMAT = "graphamp-ranges"
RANGES_VERSION = 1
MARGIN = {"float16": 2.0, "bfloat16": 1.0}  # see the module docstring


@dataclass(frozen=True)
class TensorRange:
    """What one tensor held over the data."""

    max_abs: float  # the largest finite magnitude (0.0 when no element was finite)
    min_abs: float | None  # the smallest non-zero finite magnitude (None when none)
    nonfinite: int = 0  # elements already inf or NaN in float32
    # non-zero finite elements per binade e (2**e <= |x| < 2**(e+1)), sorted by e; empty
    # where not recorded
    log2_counts: tuple[tuple[int, int], ...] = ()

    def merged(self, other: TensorRange) -> TensorRange:
        small = [v for v in (self.min_abs, other.min_abs) if v is not None]
        counts = dict(self.log2_counts)
        for exponent, count in other.log2_counts:
            counts[exponent] = counts.get(exponent, 0) + count
        return TensorRange(
            max(self.max_abs, other.max_abs),
            min(small) if small else None,
            self.nonfinite + other.nonfinite,
            tuple(sorted(counts.items())),
        )


@dataclass
class Ranges:
    """Ranges of a model's tensors over some data, by tensor name."""

    tensors: dict[str, TensorRange] = field(default_factory=dict)
    batches: int = 0  # how many batches of data they were recorded on
    model: str = ""

    def update(self, other: Ranges) -> None:
        """Fold in ranges recorded on more data."""
        for name, found in other.tensors.items():
            known = self.tensors.get(name)
            self.tensors[name] = found if known is None else known.merged(found)
        self.batches += other.batches

    def to_dict(self) -> dict[str, object]:
        return {
            "format": RANGES_FORMAT,
            "version": RANGES_VERSION,
            "model": self.model,
            "batches": self.batches,
            "tensors": {name: _range_dict(r) for name, r in sorted(self.tensors.items())},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n"

    def save(self, path: str | os.PathLike[str]) -> None:
        write_atomic(Path(path), self.to_json().encode("utf-8"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "ranges") -> Ranges:
        if data.get("format") != RANGES_FORMAT or data.get("version") != RANGES_VERSION:
            raise GraphampError(f"{where}: not a graphamp ranges file (version {RANGES_VERSION})")
        try:
            tensors = {
                str(name): TensorRange(
                    float(entry["max_abs"]),
                    None if entry["min_abs"] is None else float(entry["min_abs"]),
                    int(entry["nonfinite"]),
                    tuple(
                        sorted((int(e), int(c)) for e, c in entry.get("log2_counts", {}).items())
                    ),
                )
                for name, entry in data["tensors"].items()
            }
            return cls(tensors, int(data["batches"]), str(data.get("model", "")))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise GraphampError(f"{where}: malformed ranges ({exc!r})") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Ranges:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise GraphampError(f"{path}: cannot read ranges ({exc})") from None
        if not isinstance(data, dict):
            raise GraphampError(f"{path}: not a graphamp ranges file")
        return cls.from_dict(data, str(path))


def _range_dict(found: TensorRange) -> dict[str, object]:
    data: dict[str, object] = {
        "max_abs": found.max_abs,
        "min_abs": found.min_abs,
        "nonfinite": found.nonfinite,
    }
    if found.log2_counts:  # only where recorded: other ranges files keep their bytes
        data["log2_counts"] = {str(e): c for e, c in found.log2_counts}
    return data


def log2_counts(values: object) -> tuple[tuple[int, int], ...]:
    """The binade histogram of an array's non-zero finite magnitudes (module docstring)."""
    flat = np.abs(np.asarray(values, dtype=np.float64)).ravel()
    flat = flat[np.isfinite(flat) & (flat > 0)]
    if not flat.size:
        return ()
    _, exponents = np.frexp(flat)  # |x| = m * 2**exp with 0.5 <= m < 1: binade exp - 1
    found, counts = np.unique(exponents - 1, return_counts=True)
    return tuple((int(e), int(c)) for e, c in zip(found, counts, strict=True))


def underflow_share(found: TensorRange, threshold: float) -> float | None:
    """The share of ``found``'s non-zero finite elements whose magnitude is below
    ``threshold``, counting only binades wholly below it (None without a histogram)."""
    if not found.log2_counts:
        return None
    total = sum(count for _, count in found.log2_counts)
    below = sum(count for e, count in found.log2_counts if 2.0 ** (e + 1) <= threshold)
    return below / total if total else 0.0


def limit(dtype: str, margin: float | None = None) -> float:
    """The largest magnitude the ``range`` rule lets a low-precision op see (module docstring).
    ``margin=1`` gives exactly what overflows: float16 values at or above 65520 round to inf."""
    info = ml_dtypes.finfo(numpy_type(dtype))
    margin = MARGIN[dtype] if margin is None else margin
    if margin == 1.0:
        # Round-to-nearest sends max + half an ulp of max and above to infinity: the limit is
        # the largest number below that.
        return math.nextafter(float(info.max) + 2.0 ** (info.maxexp - 2 - info.nmant), 0.0)
    return float(info.max) / margin


@dataclass(frozen=True)
class RangeFinding:
    """Why the ``range`` rule keeps one op float32."""

    tensor: str  # the value that left the range
    max_abs: float
    limit: float
    reason: str


def range_decisions(
    ranges: Ranges, graph: OpGraph, dtype: str, *, margin: float | None = None
) -> dict[str, RangeFinding]:
    """The ops of ``graph`` that must stay float32 in ``dtype`` by the ``range`` rule, in graph
    order, each with the value that decided it (the largest of its computation-type slots)."""
    bound = limit(dtype, margin)
    used_margin = MARGIN[dtype] if margin is None else margin
    where = f"past {dtype}'s limit {bound:.6g}" + (
        f" (its largest value / margin {used_margin:g})" if used_margin != 1.0 else ""
    )
    found: dict[str, RangeFinding] = {}
    for node in graph:
        if node.kind is not NodeKind.OP:
            continue
        slots = [node.inputs[s] for s in sorted(node.follow_inputs) if s < len(node.inputs)]
        slots += [node.outputs[s] for s in sorted(node.follow_outputs) if s < len(node.outputs)]
        seen = [(ranges.tensors[name].max_abs, name) for name in slots if name in ranges.tensors]
        if not seen:
            continue
        value, tensor = max(seen, key=lambda item: (item[0], item[1]))
        if value <= bound or not math.isfinite(value):
            continue
        batches = f"{ranges.batches} batch{'es' if ranges.batches != 1 else ''}"
        found[node.name] = RangeFinding(
            tensor,
            value,
            bound,
            f"{tensor!r} reaches |x| = {value:.6g} on the calibration data ({batches}), "
            f"{where}: kept float32",
        )
    return found
