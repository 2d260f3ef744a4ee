"""Verification for the commands that verify (``convert --verify``, ``demo``): its flags, its
inputs (``--inputs`` or one random batch), the float32 model's run on the first batch before
any work, and the table.

The flags are defined with light imports only (the parser is built for ``--help`` too); what
runs a verification (numpy, rich, the dialects) is imported inside the functions."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from graphamp.cli.common import shown
from graphamp.cli.numerics import DATA_HELP
from graphamp.cli.parser import non_negative
from graphamp.errors import GraphampError, InternalError

if TYPE_CHECKING:
    import numpy as np
    from rich.console import Console

    from graphamp.dialects.base import Dialect


def add_verify_arguments(parser: argparse.ArgumentParser, *, flag: bool) -> None:
    group = parser.add_argument_group(
        "verification",
        "Run the float32 and the converted model on the same inputs and report, "
        "per output, max abs error, max error relative to max |y|, and NaN/Inf counts.",
    )
    if flag:
        group.add_argument("--verify", action="store_true", help="verify after converting")
    group.add_argument(
        "--inputs",
        metavar="DATA",
        help=f"{DATA_HELP} (default: random, never zeros, seed 0; a model that needs real "
        "values, such as a sample rate, fails on those: pass them here, e.g. np.savez("
        "'vad.npz', input=samples, sr=np.array(16000), state=state))",
    )
    group.add_argument(
        "--rtol",
        type=non_negative,
        metavar="R",
        help="allowed max |y - y32| / max |y32| (default 0.01 float16, 0.05 bfloat16)",
    )
    group.add_argument(
        "--atol",
        type=non_negative,
        default=0.0,
        metavar="A",
        help="allowed max |y - y32|, passes an output on its own (default 0)",
    )
    group.add_argument(
        "--provider",
        choices=("cpu", "cuda"),
        default=None,  # "cpu"; None tells convert that --provider was not given
        help="onnxruntime execution provider (default cpu)",
    )


def verification_inputs(
    dialect: Dialect, original: object, args: argparse.Namespace
) -> Iterable[dict[str, np.ndarray]]:
    """The batches to verify on: ``--inputs`` (an .npz or a folder of them) checked against
    the model's inputs (before anything is converted or written), else one random batch."""
    from graphamp.numerics.batches import load_input_batches
    from graphamp.numerics.inputs import random_inputs

    specs = dialect.input_specs(original)
    if not args.inputs:
        return [random_inputs(specs)]
    return load_input_batches(args.inputs, specs)


def float32_outputs(
    dialect: Dialect,
    original: object,
    feeds: Iterable[dict[str, np.ndarray]],
    args: argparse.Namespace,
) -> tuple[dict[str, np.ndarray], str]:
    """The float32 model's outputs on the first batch, run before any work: inputs it cannot
    run on (a sample rate a VAD model does not know, drawn at random) are refused in one line
    before anything is converted or written."""
    from graphamp.numerics import verify

    first = next(iter(feeds))
    try:
        return verify.run_float32(original, first, provider=args.provider, dialect=dialect)
    except verify.FloatModelFails as exc:
        raise _float32_fails(original, args, exc) from None
    except GraphampError as exc:  # onnxruntime cannot load it, say
        raise _naming(original, exc) from None


def _naming(original: object, error: Exception) -> Exception:
    """``error`` (one line) with the model file it is about first, where it does not name it
    already; errors of a kind of their own (more than a message) as they are."""
    where = _where(original)
    if not where or str(error).startswith(where) or type(error) not in _PLAIN:
        return error
    return type(error)(f"{where}{error}")


_PLAIN = (GraphampError, InternalError)


def _where(original: object) -> str:
    """The prefix naming the model file a verification line is about ("" for an object)."""
    return f"{original}: " if isinstance(original, str | Path) else ""


def _float32_fails(original: object, args: argparse.Namespace, cause: Exception) -> GraphampError:
    """The one line for a float32 model that fails on the verification inputs."""
    where = _where(original)
    if getattr(args, "inputs", None):
        return GraphampError(f"{where}the float32 model fails on {args.inputs} ({cause})")
    return GraphampError(
        f"{where}the float32 model fails on random inputs ({cause}): pass --inputs"
    )


def report_verification(
    console: Console,
    dialect: Dialect,
    original: object,
    converted: object,
    args: argparse.Namespace,
    dtype: str,
    feeds: Iterable[dict[str, np.ndarray]] | None = None,
    reference: tuple[dict[str, np.ndarray], str] | None = None,
) -> int:
    """Run both models (objects or saved files) through ``dialect`` on each batch and print
    the table (each output's worst batch); 1 when an output is over tolerance. ``reference``:
    the float32 model's outputs on the first batch, from :func:`float32_outputs`."""
    from rich.table import Table

    from graphamp.numerics import verify

    if feeds is None:
        feeds = verification_inputs(dialect, original, args)
    rtol = args.rtol if args.rtol is not None else verify.DEFAULT_RTOL[dtype]
    try:
        report = verify.worst(
            verify.verify(
                original,
                converted,
                batch,
                rtol=rtol,
                atol=args.atol,
                provider=args.provider,
                dialect=dialect,
                reference=reference if index == 0 else None,
            )
            for index, batch in enumerate(feeds)
        )
    except verify.FloatModelFails as exc:
        raise _float32_fails(original, args, exc) from None
    except (GraphampError, InternalError) as exc:  # the converted model fails where IN runs
        raise _naming(original, exc) from None
    table = Table(
        title=f"verification on {report.provider}, rtol {rtol:g}, atol {args.atol:g}",
        title_justify="left",
    )
    for column in ("output", "max abs error", "max rel error", "NaN/Inf", "result"):
        table.add_column(column, justify="left" if column == "output" else "right")
    for output in report.outputs:
        table.add_row(
            shown(output.name),
            f"{output.max_abs_error:.3g}",
            f"{output.max_rel_error:.3g}",
            str(output.nan_inf),
            "ok" if report.passed(output) else "[red]OVER[/]",
        )
    console.print(table)
    wide = [(o.name, o.reference_nan_inf) for o in report.outputs if o.reference_nan_inf]
    if wide:  # those values compare nothing: an input the float32 model cannot take?
        named = ", ".join(f"{shown(name)} ({count})" for name, count in wide)
        console.print(
            f"[yellow]warning[/]: the float32 model itself gives NaN/Inf on these inputs in "
            f"{named}: those values are left out of the errors (NaN/Inf counts only new ones)"
        )
    if not report.ok:
        see = " (see --plan)" if hasattr(args, "plan") else ""  # demo has no --plan
        console.print(
            "[red]verification failed[/]: the converted model was written; deny the ops "
            f"or names behind the error{see} and convert again"
        )
        return 1
    return 0
