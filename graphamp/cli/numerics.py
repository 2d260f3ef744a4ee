"""What the numerics commands share: DATA arguments, calibration and the ONNX-only check."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from graphamp.errors import GraphampError

if TYPE_CHECKING:
    from graphamp.dialects.base import Dialect
    from graphamp.numerics.batches import InputBatches
    from graphamp.numerics.ranges import Ranges

DATA_HELP = (
    "an .npz with one array per graph input (the batch along the first axis), or a folder "
    "of such files"
)


def add_calibrate_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--calibrate",
        metavar="DATA",
        help=f"run the float32 model on DATA ({DATA_HELP}) and keep float32, with rule "
        "'range', every op whose inputs or outputs there leave the target type's range "
        "(float16: |x| > 65504/2; bfloat16: what it cannot hold)",
    )


def add_inputs_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--inputs", metavar="DATA", required=True, help=f"{what}: {DATA_HELP}")


def batches(dialect: Dialect, model: object, data: str) -> InputBatches:
    """The batches of ``data`` for ``model``, every file checked before any work."""
    from graphamp.numerics.batches import load_input_batches

    return load_input_batches(data, dialect.input_specs(model))


def calibrated(dialect: Dialect, source: Path, args: argparse.Namespace) -> Ranges | None:
    """The ranges ``--calibrate DATA`` records on the float32 model (None without it)."""
    data = getattr(args, "calibrate", None)
    if not data:
        return None
    return dialect.calibrate(source, batches(dialect, source, data))


def require_onnx(dialect: Dialect, path: Path, command: str) -> None:
    if dialect.name != "onnx":
        raise GraphampError(
            f"{path}: graphamp {command} works on ONNX models; this is a {dialect.name} model"
        )
