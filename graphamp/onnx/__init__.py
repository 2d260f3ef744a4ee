"""The ONNX dialect's Python API: convert a float32 ONNX model to mixed precision.

    >>> import graphamp.onnx
    >>> result = graphamp.onnx.convert("model.onnx", dtype="float16")   # doctest: +SKIP
    >>> graphamp.onnx.save(result, "model.fp16.onnx")              # doctest: +SKIP

The work is the engine's (:mod:`graphamp.engine`) over :class:`OnnxDialect`; this module picks
the policy from keyword overrides and returns ONNX types.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, TypedDict

import onnx

from graphamp import engine
from graphamp.errors import GraphampError
from graphamp.numerics.ranges import Ranges
from graphamp.onnx.conversion import Conversion
from graphamp.onnx.dialect.plugin import OnnxDialect
from graphamp.onnx.io import files
from graphamp.onnx.io.files import from_proto, inferred_types, load
from graphamp.passes.options import Options
from graphamp.plans.plan import Plan
from graphamp.policy.policy import Policy
from graphamp.training.float8 import Float8

if TYPE_CHECKING:  # nothing converts through onnx_ir: it is imported for its own models only
    import onnx_ir as ir

    from graphamp.dialects.base import Dialect
    from graphamp.numerics.batches import DataSource
    from graphamp.onnx.numerics.debugging import DebugReport
    from graphamp.onnx.numerics.tuning import TuneResult

__all__ = [
    "Conversion",
    "OnnxDialect",
    "Ranges",
    "analyse",
    "calibrate",
    "convert",
    "debug",
    "from_proto",
    "inferred_types",
    "load",
    "save",
    "tune",
]

Model: TypeAlias = "str | os.PathLike[str] | onnx.ModelProto | ir.Model"


def save(
    model: Conversion | onnx.ModelProto | ir.Model,
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
) -> None:
    """Write ``model`` to ``path`` atomically: a :class:`Conversion` (its weights read, and
    rounded, from the input as they are written), a ``ModelProto`` or an ``onnx_ir`` model.
    Weights go to ``<name>.data`` beside it where the input kept them in external data or the
    model is over 2 GB; a path that would write over a file the model was read from is refused
    unless ``overwrite`` says so (:func:`graphamp.onnx.io.files.save`)."""
    _check_target(Path(path))
    if isinstance(model, Conversion):
        model.save(path, overwrite=overwrite)
    else:
        files.save(model, path, overwrite=overwrite)


def _check_target(path: Path) -> None:
    """A path the model cannot be saved to, in one line: a folder, a missing folder (an
    OSError naming a hidden temporary file otherwise), a name another format's suffix claims
    (``model.pt2`` would hold ONNX bytes the CLI then refuses to read as a program)."""
    from graphamp.dialects.registry import named_by_suffix

    if path.is_dir():
        raise GraphampError(f"{path}: is a folder; give the model file's path")
    if not path.parent.is_dir():
        raise GraphampError(f"{path}: folder {path.parent} does not exist")
    claimed = named_by_suffix(path)
    if claimed is not None and claimed[0] != "onnx":
        raise GraphampError(
            f"{path}: {claimed[1]} names a {claimed[0]} file, but this is an ONNX model"
        )


def calibrate(model: Model, data: DataSource, *, histograms: bool = False) -> Ranges:
    """The ranges of ``model``'s float32 values on ``data`` (a DATA path, a dict of arrays or
    an iterable of them): see :mod:`graphamp.onnx.numerics.calibration`. ``histograms`` also records
    the binade histograms of the values matrix ops read (float8's underflow rule)."""
    from graphamp.onnx.numerics.calibration import calibrate as run

    return run(model, data, histograms=histograms)


def debug(
    original: Model, converted: Model, data: DataSource, *, plan: Plan | None = None
) -> DebugReport:
    """Where ``converted`` departs from ``original`` on ``data``, node by node: see
    :mod:`graphamp.onnx.numerics.debugging`."""
    from graphamp.onnx.numerics.debugging import debug as run

    return run(original, converted, data, plan=plan)


def tune(
    model: Model,
    data: DataSource,
    *,
    rtol: float,
    atol: float = 0.0,
    policy: Policy | None = None,
    ranges: Ranges | None = None,
    options: Options | None = None,
) -> TuneResult:
    """The fewest nodes to keep float32 so the conversion meets ``rtol``/``atol`` on ``data``,
    and that conversion: see :mod:`graphamp.onnx.numerics.tuning`."""
    from graphamp.onnx.numerics.tuning import tune as run

    return run(model, data, rtol=rtol, atol=atol, policy=policy, ranges=ranges, options=options)


def _policy(policy: Policy | None, overrides: dict[str, object], reviewed: Plan | None) -> Policy:
    if policy is None and reviewed is not None and not overrides:
        return engine.reviewed_policy(reviewed, reviewed.model or "plan")
    if policy is None:
        # arg-type: the caller's keywords, as given; Policy.create refuses a name it lacks
        return Policy.create(where="convert()", **overrides)  # type: ignore[arg-type]
    if overrides:
        raise GraphampError("pass either a policy or keyword overrides, not both")
    return policy


class _EngineArguments(TypedDict):
    policy: Policy
    dialect: Dialect
    reviewed: Plan | None
    options: Options


def _engine_arguments(
    policy: Policy | None,
    overrides: dict[str, object],
    reviewed: Plan | None,
    ranges: Ranges | None,
    fp8: Float8 | None = None,
    strict: bool = False,
) -> _EngineArguments:
    """What analyse() and convert() hand the engine."""
    if fp8 is not None:
        if fp8.recipe != "static":
            raise GraphampError(
                f"ONNX float8 takes static scales from calibration: Float8.static(), not "
                f"Float8.{fp8.recipe}()"
            )
        if ranges is None:
            raise GraphampError("float8 (fp8=) needs ranges= from calibrate(): its scales")
    return {
        "policy": _policy(policy, overrides, reviewed),
        "dialect": OnnxDialect(),
        "reviewed": reviewed,
        "options": Options(ranges=ranges, fp8=fp8, strict=strict),
    }


def analyse(
    model: Model,
    policy: Policy | None = None,
    *,
    reviewed: Plan | None = None,
    ranges: Ranges | None = None,
    fp8: Float8 | None = None,
    strict: bool = False,
    **overrides: object,
) -> engine.Analysis:
    """Read ``model`` and run the passes: its graph, plan and edit script; nothing converted
    (the arguments are :func:`convert`'s)."""
    arguments = _engine_arguments(policy, overrides, reviewed, ranges, fp8, strict)
    return engine.analyse(model, **arguments)


def convert(
    model: Model,
    policy: Policy | None = None,
    *,
    reviewed: Plan | None = None,
    ranges: Ranges | None = None,
    fp8: Float8 | None = None,
    strict: bool = False,
    **overrides: object,
) -> Conversion:
    """Convert a float32 ONNX model to mixed precision.

    ``model`` is a path, a ``ModelProto`` or an ``onnx_ir`` model (neither is modified).
    ``policy`` defaults to the float16 defaults; keyword ``overrides`` (``dtype``, ``allow``,
    ``deny_names``, ``keep_io_types``, ...) go to :meth:`Policy.create`. ``reviewed`` applies
    that plan's decisions instead (and refuses a model that no longer matches it); its own
    policy is used. ``ranges`` (from :func:`calibrate`) keeps float32, with rule ``range``,
    every op whose values leave the target type's range on that data.
    ``fp8`` (``graphamp.Float8.static()``, with ``ranges`` from ``calibrate(...,
    histograms=True)``) puts float8 operands on the matrix ops the fp8 rules choose:
    QuantizeLinear/DequantizeLinear activations, float8 weights (docs/float8.md).
    ``strict`` makes a policy rule that matches nothing in the model (a
    :class:`~graphamp.errors.PolicyWarning`) an error, as ``--strict`` does.
    """
    arguments = _engine_arguments(policy, overrides, reviewed, ranges, fp8, strict)
    result = engine.convert(model, **arguments)
    conversion = Conversion(result.model, result.plan, result.seconds, result.graph)
    if isinstance(model, str | os.PathLike):
        conversion.read_from = Path(model)
    return conversion
