"""Numerical verification: run the float32 and the converted model on the same inputs.

The models are run by their dialect (:meth:`Dialect.run`); the report gives, per output, the
max absolute error, the max relative error (relative to max |y| of the float32 output) and
NaN/Inf counts. Inputs come from :mod:`graphamp.numerics.inputs` (random, never zeros) unless the
user gives an ``.npz``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from graphamp.dialects.base import Dialect
from graphamp.dialects.registry import for_object
from graphamp.errors import InternalError, RunFailure
from graphamp.numerics.inputs import random_inputs as _random_inputs


class FloatModelFails(RunFailure):
    """The float32 model itself fails on the inputs (the message: what its runtime said): the
    inputs do not suit it, so there is nothing to verify against."""


# Default tolerance on max |y - y32| / max |y32| per output, by target dtype.
DEFAULT_RTOL = {"float16": 1e-2, "bfloat16": 5e-2}


@dataclass
class OutputReport:
    name: str
    max_abs_error: float
    max_rel_error: float  # max |y - y32| / max |y32|
    nan_inf: int  # NaN/Inf in the converted output that the float32 output does not have
    reference_nan_inf: int


@dataclass
class Report:
    outputs: list[OutputReport]
    rtol: float
    atol: float
    provider: str

    def passed(self, output: OutputReport) -> bool:
        """No new NaN/Inf, and within rtol (relative to max |y32|) or within atol."""
        return output.nan_inf == 0 and (
            output.max_rel_error <= self.rtol or output.max_abs_error <= self.atol
        )

    @property
    def ok(self) -> bool:
        return all(self.passed(output) for output in self.outputs)


def worst(reports: Iterable[Report]) -> Report:
    """One report of several batches' reports: per output, the largest errors and the NaN/Inf
    counts summed."""
    merged: dict[str, OutputReport] = {}
    first: Report | None = None
    for report in reports:
        first = first or report
        for output in report.outputs:
            known = merged.get(output.name)
            merged[output.name] = (
                output
                if known is None
                else OutputReport(
                    output.name,
                    max(known.max_abs_error, output.max_abs_error),
                    max(known.max_rel_error, output.max_rel_error),
                    known.nan_inf + output.nan_inf,
                    known.reference_nan_inf + output.reference_nan_inf,
                )
            )
    if first is None:
        raise ValueError("no reports to merge")
    return Report(list(merged.values()), first.rtol, first.atol, first.provider)


def random_inputs(
    model: object, *, seed: int = 0, dialect: Dialect | None = None
) -> dict[str, np.ndarray]:
    """Random inputs for ``model``'s graph inputs (see :mod:`graphamp.numerics.inputs`)."""
    dialect = dialect or for_object(model)
    return _random_inputs(dialect.input_specs(model), seed=seed)


def compare(
    reference: dict[str, np.ndarray],
    converted: dict[str, np.ndarray],
    *,
    rtol: float,
    atol: float,
    provider: str,
) -> Report:
    return Report(
        [_output_report(name, expected, converted[name]) for name, expected in reference.items()],
        rtol,
        atol,
        provider,
    )


# Elements per step of the comparison: float64 copies of a chunk stay in the cache, where
# whole copies of a large output (GPT-2's logits: 51 M values) cost more than the arithmetic.
_CHUNK = 1 << 16


def _output_report(name: str, expected: np.ndarray, actual: np.ndarray) -> OutputReport:
    """max |y - y32| (over the values finite in both), relative to max |y32| (over the finite
    ones), and the NaN/Inf counts; in float64, chunk by chunk (the same numbers as whole)."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.shape != actual.shape:  # broadcast as a whole (no chunks)
        expected, actual = np.broadcast_arrays(expected, actual)
    expected, actual = expected.reshape(-1), actual.reshape(-1)
    scale = max_abs = 0.0
    nan_inf = reference_nan_inf = 0
    for start in range(0, expected.size, _CHUNK):
        expected64 = expected[start : start + _CHUNK].astype(np.float64)
        actual64 = actual[start : start + _CHUNK].astype(np.float64)
        diff = np.abs(actual64 - expected64)
        finite, finite_actual = np.isfinite(expected64), np.isfinite(actual64)
        if finite.all() and finite_actual.all():  # the common case: no masks
            scale = max(scale, float(np.max(np.abs(expected64))))
            max_abs = max(max_abs, float(diff.max()))
            continue
        if finite.any():
            scale = max(scale, float(np.max(np.abs(expected64[finite]))))
        both = diff[finite & finite_actual]
        if both.size:
            max_abs = max(max_abs, float(both.max()))
        nan_inf += int(np.count_nonzero(~finite_actual & finite))
        reference_nan_inf += int(np.count_nonzero(~finite))
    return OutputReport(
        name=name,
        max_abs_error=max_abs,
        max_rel_error=max_abs / scale if scale else max_abs,
        nan_inf=nan_inf,
        reference_nan_inf=reference_nan_inf,
    )


def verify(
    original: object,
    converted: object,
    feeds: dict[str, np.ndarray],
    *,
    rtol: float,
    atol: float = 0.0,
    provider: str = "cpu",
    dialect: Dialect | None = None,
    reference: tuple[dict[str, np.ndarray], str] | None = None,
) -> Report:
    """Run both models on ``feeds`` and compare every output; ``reference``: the float32
    model's outputs on ``feeds`` and what computed them, where :func:`run_float32` gave them
    already."""
    dialect = dialect or for_object(original)
    if reference is None:
        reference = run_float32(original, feeds, provider=provider, dialect=dialect)
    reference_outputs, reference_backend = reference
    try:
        outputs, backend = dialect.run(converted, feeds, provider=provider)
    except RunFailure as exc:  # what the float32 model ran on, the conversion must too
        raise InternalError(
            f"the converted model fails where the float32 model runs ({exc})"
        ) from None
    label = (
        backend if backend == reference_backend else f"{backend} vs float32 on {reference_backend}"
    )
    return compare(reference_outputs, outputs, rtol=rtol, atol=atol, provider=label)


def run_float32(
    original: object, feeds: dict[str, np.ndarray], *, provider: str, dialect: Dialect
) -> tuple[dict[str, np.ndarray], str]:
    """The float32 model's outputs on ``feeds`` and what computed them; FloatModelFails where
    its runtime cannot run it on them."""
    try:
        return dialect.run(original, feeds, provider=provider)
    except RunFailure as exc:
        raise FloatModelFails(str(exc)) from None
