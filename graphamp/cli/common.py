"""What the graphamp commands share: the parser type, the policy and verification flags, reading
a model or plan file through its dialect, and the summary and verification tables."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from graphamp import engine, verify
from graphamp.dialects.base import Dialect
from graphamp.dialects.registry import for_file
from graphamp.errors import GraphampError
from graphamp.graph import OpGraph
from graphamp.inputs import load_npz, random_inputs
from graphamp.io import write_atomic
from graphamp.plan import Plan, is_plan_file
from graphamp.policy import DTYPES, LISTS, Policy

POLICY_FLAGS = ("dtype", "keep_io_types", *LISTS, "deny_name", "deny_tensor", "config")


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), as every graphamp error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"graphamp: error: {message} (see '{self.prog} --help')\n")


def _ops(text: str) -> list[str]:
    ops = [op.strip() for op in text.split(",") if op.strip()]
    if not ops:
        raise argparse.ArgumentTypeError("expected a comma-separated list of op types")
    return ops


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "policy",
        "What runs in low precision. OPS is a comma-separated list of op types; naming "
        "an op under one flag moves it out of the other lists. Flags win over --config.",
    )
    group.add_argument(
        "--dtype",
        choices=DTYPES,
        help="target type (default float16; bfloat16 for .pt2 programs; or the config's)",
    )
    group.add_argument(
        "--keep-io-types",
        nargs="?",
        const=True,
        metavar="NAMES",
        help="keep graph inputs/outputs in their float32 type: all of them, or the "
        "comma-separated NAMES",
    )
    for name, meaning in (
        ("allow", "always low precision (unless a name rule denies them)"),
        ("infer", "low precision between low-precision neighbours"),
        ("clear", "follow any low-precision neighbour"),
        ("deny", "always float32; deny spreads to following infer/clear ops"),
    ):
        group.add_argument(
            f"--{name}",
            type=_ops,
            metavar="OPS",
            action="extend",
            help=f"op types that run {meaning}",
        )
    group.add_argument(
        "--deny-name",
        action="append",
        default=[],
        metavar="GLOB",
        help="keep nodes whose name matches GLOB in float32 (repeatable)",
    )
    group.add_argument(
        "--deny-tensor",
        action="append",
        default=[],
        metavar="NAME",
        help="keep every op reading or writing tensor NAME in float32 (repeatable)",
    )
    group.add_argument(
        "--config", metavar="FILE", help="a TOML policy file with a [graphamp] table (see README)"
    )


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
        metavar="FILE.npz",
        help="input arrays by name (default: random, never zeros, seed 0)",
    )
    group.add_argument(
        "--rtol",
        type=float,
        metavar="R",
        help="allowed max |y - y32| / max |y32| (default 0.01 float16, 0.05 bfloat16)",
    )
    group.add_argument(
        "--atol",
        type=float,
        default=0.0,
        metavar="A",
        help="allowed max |y - y32|, passes an output on its own (default 0)",
    )
    group.add_argument(
        "--provider",
        choices=("cpu", "cuda"),
        default="cpu",
        help="onnxruntime execution provider (default cpu)",
    )


def policy_flags_given(args: argparse.Namespace) -> list[str]:
    """The policy flags set on the command line, as the user spelt them."""
    given = []
    for name in POLICY_FLAGS:
        value = getattr(args, name, None)
        if value not in (None, [], False):
            given.append("--" + name.replace("_", "-"))
    return given


def policy_from_args(args: argparse.Namespace, dialect: Dialect) -> Policy:
    """The policy of the flags (and ``--config``) for a model of ``dialect``."""
    overrides: dict[str, object] = {"dialect": dialect.lists}
    if args.dtype:
        overrides["dtype"] = args.dtype
    if args.keep_io_types is not None:
        overrides["keep_io_types"] = (
            True if args.keep_io_types is True else [n for n in args.keep_io_types.split(",") if n]
        )
    for name in LISTS:
        if getattr(args, name):
            overrides[name] = getattr(args, name)
    if args.deny_name:
        overrides["deny_names"] = args.deny_name
    if args.deny_tensor:
        overrides["deny_tensors"] = args.deny_tensor
    if args.config:
        return Policy.from_toml(args.config, default_dtype=dialect.default_dtype, **overrides)
    return Policy.from_mapping(
        {}, where="command line", default_dtype=dialect.default_dtype, **overrides
    )


def plan_of(path: str | Path, args: argparse.Namespace) -> tuple[OpGraph | None, Plan]:
    """(graph or None, Plan) of a model file (through its dialect, under the policy flags of
    ``args``) or of a plan file."""
    path = Path(path)
    if is_plan_file(path):
        return None, Plan.load(path)
    dialect = for_file(path)
    analysis = engine.analyse(path, policy_from_args(args, dialect), dialect=dialect)
    return analysis.graph, analysis.plan


def emit(text: str, output: str | None) -> None:
    if output:
        write_atomic(Path(output), text.encode("utf-8"))
    else:
        sys.stdout.write(text)


def print_summary(console: Console, plan: Plan, seconds: float, source: Path, target: Path) -> None:
    summary = plan.summary()
    weights = plan.weights
    before = sum(w.bytes_before for w in weights if w.in_place)
    after = sum(w.bytes_after for w in weights)
    table = Table(
        title=f"{source.name} -> {target.name} ({plan.dtype})",
        title_justify="left",
        show_header=False,
    )
    table.add_column("what")
    table.add_column("value", justify="right")
    for precision, count in summary["nodes"].items():  # type: ignore[union-attr]
        label = "nodes with no float math" if precision == "none" else f"nodes in {precision}"
        table.add_row(label, str(count))
    table.add_row(
        "MatMul/Gemm/Conv in low precision",
        f"{summary['matrix_ops_low']} of {summary['matrix_ops']}",
    )
    table.add_row("casts inserted", str(summary["casts_inserted"]))
    if summary["casts_removed"] or summary["casts_retargeted"]:
        table.add_row(
            "casts removed / retargeted",
            f"{summary['casts_removed']} / {summary['casts_retargeted']}",
        )
    table.add_row("weights converted", f"{len(weights)} ({_size(before)} -> {_size(after)})")
    if summary["values_flushed_to_zero"]:
        table.add_row("weight values flushed to zero", str(summary["values_flushed_to_zero"]))
    table.add_row("time", f"{seconds:.2f} s")
    console.print(table)


def report_verification(
    console: Console,
    dialect: Dialect,
    original: object,
    converted: object,
    args: argparse.Namespace,
    dtype: str,
) -> int:
    """Run both models (objects or saved files) through ``dialect`` and print the table;
    1 when an output is over tolerance."""
    feeds = load_npz(args.inputs) if args.inputs else random_inputs(dialect.input_specs(original))
    rtol = args.rtol if args.rtol is not None else verify.DEFAULT_RTOL[dtype]
    report = verify.verify(
        original,
        converted,
        feeds,
        rtol=rtol,
        atol=args.atol,
        provider=args.provider,
        dialect=dialect,
    )
    table = Table(
        title=f"verification on {report.provider}, rtol {rtol:g}, atol {args.atol:g}",
        title_justify="left",
    )
    for column in ("output", "max abs error", "max rel error", "NaN/Inf", "result"):
        table.add_column(column, justify="left" if column == "output" else "right")
    for output in report.outputs:
        table.add_row(
            output.name,
            f"{output.max_abs_error:.3g}",
            f"{output.max_rel_error:.3g}",
            str(output.nan_inf),
            "ok" if report.passed(output) else "[red]OVER[/]",
        )
    console.print(table)
    if not report.ok:
        console.print(
            "[red]verification failed[/]: the converted model was written; deny the ops "
            "or names behind the error (see --plan) and convert again"
        )
        return 1
    return 0


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"


def check_output_path(source: Path, target: Path) -> None:
    if target.resolve() == source.resolve():
        raise GraphampError(
            f"{target}: the output path is the input; graphamp never overwrites its input"
        )
    if not target.parent.is_dir():
        raise GraphampError(f"{target}: folder {target.parent} does not exist")
