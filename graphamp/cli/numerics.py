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
    from graphamp.training.float8 import Float8

DATA_HELP = (
    "an .npz with one array per graph input by name, fed as it is (a 0-d array for a scalar "
    "input, a state with its batch on axis 1 as it is; a file holding a multiple of a fixed "
    "batch that every input declares first is split into batches), or a folder of such files"
)


def add_calibrate_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--calibrate",
        metavar="DATA",
        help=f"run the float32 model on DATA ({DATA_HELP}) and keep float32, with rule "
        "'range', every op whose inputs or outputs there leave the target type's range "
        "(float16: |x| > 65504/2; bfloat16: what it cannot hold)",
    )


def add_fp8_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fp8",
        action="store_true",
        help="(ONNX, needs --calibrate) also put float8 (E4M3) operands on the matrix ops "
        "decided low that the float8 rules choose: activations QuantizeLinear/"
        "DequantizeLinear per tensor at max|x|*2/448 from DATA, weights stored float8 with "
        "a DequantizeLinear per output channel; opset 21 or later. Kept in the low type, "
        "each with its rule in the plan: products of two activations (attention), the last "
        "matrix op, K or N not a multiple of 16, values that would underflow "
        "(docs/float8.md)",
    )
    parser.add_argument(
        "--fp8-deny-names",
        metavar="GLOB",
        nargs="+",
        action="extend",
        default=[],
        help="with --fp8: keep these nodes (globs on node names) out of float8 (several after "
        "the flag, or the flag repeated; it takes every word up to the next flag, so give IN "
        "before it)",
    )
    parser.add_argument(
        "--fp8-embeddings",
        action="store_true",
        help="with --fp8: also store each embedding table (a Gather's stored data) in 8 bits: "
        "int8 with one scale per row (max|row|/127); the Gather reads the int8 rows and "
        "their scales and multiplies them back to the low type, so only the gathered rows are "
        "dequantised (ONNX has no float8 Gather); a position table the exporter folded into "
        "a constant added to a lookup is read through a DequantizeLinear. Each table's "
        "decision is in the plan (rule fp8_table) (docs/float8.md)",
    )
    parser.add_argument(
        "--fp8-kept-int8",
        action="store_true",
        help="with --fp8: store the weight of each matrix op kept out of float8 for its shape, "
        "its range, tuning or as the last matrix op (the LM head) as int8 with one scale per "
        "output channel (max|w|/127), a DequantizeLinear giving the op its weight in the low "
        "type: weight-only 8 bits, the op still computes in the low type. Deny names and MoE "
        "routers keep their weights; each kept op's reason in the plan says which it did "
        "(docs/float8.md)",
    )


def check_fp8_flags(args: argparse.Namespace) -> None:
    """One-line errors for float8 flags that cannot work together, before any work."""
    for flag in ("fp8_deny_names", "fp8_embeddings", "fp8_kept_int8"):
        if getattr(args, flag, None) and not args.fp8:
            raise GraphampError(f"--{flag.replace('_', '-')} is only used with --fp8")
    if getattr(args, "fp8", False) and not getattr(args, "calibrate", None):
        raise GraphampError(
            "--fp8 needs --calibrate DATA: an ONNX model's float8 scales are fixed from "
            "calibration (max |x| / 448 per activation, with one binade of headroom)"
        )


def float8_option(args: argparse.Namespace, dialect: Dialect, source: Path) -> Float8 | None:
    """The ``Float8`` of ``--fp8`` (static scales: ONNX models only), None without it; a
    model that already holds quantisers is refused here, before calibration runs it."""
    if not getattr(args, "fp8", False):
        return None
    from graphamp.training.float8 import Float8

    if dialect.name != "onnx":
        raise GraphampError(
            f"{source}: --fp8 converts ONNX models; for a PyTorch model use "
            "graphamp.fx.convert(..., fp8=graphamp.Float8...) (docs/float8.md)"
        )
    from graphamp.onnx.dialect.float8 import refuse_quantised_file

    refuse_quantised_file(source)
    return Float8.static(
        deny_names=tuple(args.fp8_deny_names),
        embeddings=bool(args.fp8_embeddings),
        kept_int8=bool(args.fp8_kept_int8),
    )


def add_inputs_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--inputs", metavar="DATA", required=True, help=f"{what}: {DATA_HELP}")


def batches(dialect: Dialect, model: object, data: str) -> InputBatches:
    """The batches of ``data`` for ``model``, every file checked before any work."""
    from graphamp.numerics.batches import load_input_batches

    return load_input_batches(data, dialect.input_specs(model))


def calibrated(
    dialect: Dialect, source: Path, args: argparse.Namespace, *, histograms: bool = False
) -> Ranges | None:
    """The ranges ``--calibrate DATA`` records on the float32 model (None without it); with
    ``histograms``, float8's binade histograms of the values matrix ops read too."""
    data = getattr(args, "calibrate", None)
    if not data:
        return None
    if histograms:
        return dialect.calibrate(source, batches(dialect, source, data), histograms=True)
    return dialect.calibrate(source, batches(dialect, source, data))


def require_onnx(dialect: Dialect, path: Path, command: str) -> None:
    if dialect.name != "onnx":
        raise GraphampError(
            f"{path}: graphamp {command} works on ONNX models; this is a {dialect.name} model"
        )
