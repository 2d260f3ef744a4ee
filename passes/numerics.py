"""Float conversions of stored values: exact rounding, overflow and flush-to-zero counts.

numpy has float16; bfloat16 comes from ``ml_dtypes`` (a dependency of onnx), which rounds to
nearest even like the hardware does.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from graphamp.core.dtypes import numpy_type


def overflow_threshold(dtype: str) -> float:
    """The smallest magnitude that rounds to infinity in ``dtype`` (float16: 65520)."""
    info = ml_dtypes.finfo(numpy_type(dtype))
    # Round-to-nearest sends values at or above max + half an ulp of max to infinity; the ulp
    # at max is 2**(maxexp - 1 - nmant).
    return float(info.max) + 2.0 ** (info.maxexp - 2 - info.nmant)


# float32's largest finite magnitude. A stored float32 value exactly at it is a stand-in for
# infinity, not a magnitude: HF's and torch's attention masks fill with finfo(float32).min.
# Such values are stored at half the target's largest magnitude (counted in the plan as
# ``at_limit``), never rounded to inf or clamped silently: at half, adding a score to the mask
# stays finite, as it does in float32 (where the mask absorbs it), so a fully masked row is
# still a distribution rather than inf - inf = NaN. Any other value beyond the target's range
# keeps its readers float32.
FLOAT32_LIMIT = float(np.finfo(np.float32).max)


def stand_in(dtype: str) -> float:
    """The magnitude a value at float32's limit is stored at in ``dtype``: half its largest."""
    return float(ml_dtypes.finfo(numpy_type(dtype)).max) / 2


def at_limit_count(values: np.ndarray) -> int:
    """How many of ``values`` sit exactly at float32's lowest or highest finite value."""
    return int(np.count_nonzero(values == FLOAT32_LIMIT)) + int(
        np.count_nonzero(values == -FLOAT32_LIMIT)
    )


def to_target_limit(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` with float32's lowest/highest replaced by +-:func:`stand_in` (a copy only
    when some are there), which ``dtype`` holds exactly, instead of rounding to infinity."""
    at_limit = np.abs(values) == FLOAT32_LIMIT
    if not at_limit.any():
        return values
    return np.where(at_limit, np.copysign(stand_in(dtype), values), values).astype(values.dtype)


def flush_threshold(dtype: str) -> float:
    """Magnitudes at or below this round to zero in ``dtype``: half the smallest subnormal
    (the tie goes to the even neighbour, zero)."""
    return float(ml_dtypes.finfo(numpy_type(dtype)).smallest_subnormal) / 2


def count_flushed(values: np.ndarray, dtype: str) -> int:
    """Non-zero values that become zero in ``dtype``, counted without converting."""
    limit = flush_threshold(dtype)
    tiny = int(np.count_nonzero((values <= limit) & (values >= -limit)))
    return tiny - int(np.count_nonzero(values == 0))


@dataclass
class Converted:
    values: np.ndarray
    overflowed: int  # finite values that became infinite
    flushed_to_zero: int  # non-zero values that became zero


def convert_values(values: np.ndarray, dtype: str) -> Converted:
    """``values`` rounded to ``dtype``, with the counts a plan reports."""
    with np.errstate(over="ignore"):  # counted below, and refused or reported by the callers
        converted: np.ndarray = values.astype(numpy_type(dtype))
    if values.size == 0:
        return Converted(converted, 0, 0)
    # Rounding keeps zeros zero and infinities infinite, so the differences of the counts are
    # the values that flushed or overflowed: no temporary float32 copy of the result needed.
    overflowed = int(np.count_nonzero(np.isinf(converted))) - int(
        np.count_nonzero(np.isinf(values))
    )
    flushed = int(np.count_nonzero(converted == 0)) - int(np.count_nonzero(values == 0))
    return Converted(converted, overflowed, flushed)
