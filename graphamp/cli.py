"""The ``graphamp`` command line: convert a model file, run the demo, show the default lists."""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from graphamp.errors import GraphampError
from graphamp.policy import DTYPES, LISTS, Policy

EXAMPLES = """\
examples:
  graphamp demo
  graphamp convert model.onnx -o model.fp16.onnx --verify
  graphamp convert model.onnx -o model.bf16.onnx --dtype bfloat16 --keep-io-types
  graphamp convert model.onnx -o out.onnx --deny Softmax --deny-name '/layers.11/*' --plan plan.json
  graphamp convert model.onnx -o out.onnx --config amp.toml --verify --inputs batch.npz
  graphamp lists --dtype bfloat16

exit status: 0 success, 1 --verify found the error over tolerance, 2 bad input or option.
"""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), as every graphamp error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"graphamp: error: {message} (see '{self.prog} --help')\n")


def _ops(text: str) -> list[str]:
    ops = [op.strip() for op in text.split(",") if op.strip()]
    if not ops:
        raise argparse.ArgumentTypeError("expected a comma-separated list of op types")
    return ops


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="graphamp",
        description="Static-graph automatic mixed precision: converts a float32 model so that "
        "each op computes in float16/bfloat16 or stays float32, with the fewest casts and a "
        "reason for every decision.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log each pass (-vv: every decision) to stderr",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    convert = commands.add_parser(
        "convert",
        help="convert an ONNX model file",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Convert IN (a float32 ONNX model) to mixed precision and write OUT. "
        "The input is never modified; OUT is written atomically, and not at all on error.",
    )
    convert.add_argument("input", metavar="IN", help="the float32 ONNX model")
    convert.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        required=True,
        help="where to write the converted model (not IN itself)",
    )
    add_policy_arguments(convert)
    convert.add_argument(
        "--plan",
        metavar="PLAN.json",
        help="also write the precision plan (every decision and its reason) as JSON",
    )
    add_verify_arguments(convert, flag=True)

    demo = commands.add_parser(
        "demo",
        help="convert a bundled model and verify it (no arguments needed)",
        description="Build a model of the models/ zoo in code (random weights), convert it, "
        "print the summary and verify it against float32 on onnxruntime.",
    )
    demo.add_argument(
        "--model",
        default="mnist",
        help="zoo model: simplenet, mnist, resnet, bert, gpt (default: mnist)",
    )
    demo.add_argument(
        "--size", default="small", choices=("small", "full"), help="model size (default: small)"
    )
    demo.add_argument("--dtype", default="float16", choices=DTYPES, help="target type")
    demo.add_argument(
        "--keep", metavar="DIR", help="keep the float32 and converted models and the plan in DIR"
    )
    add_verify_arguments(demo, flag=False)

    lists = commands.add_parser(
        "lists",
        help="show the default op lists and the reason for each",
        description="Print the op lists a policy starts from.",
    )
    lists.add_argument("--dtype", default="float16", choices=DTYPES, help="target type")
    lists.add_argument("--config", metavar="FILE", help="show the lists after this policy file")
    return parser


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "policy",
        "What runs in low precision. OPS is a comma-separated list of op types; naming "
        "an op under one flag moves it out of the other lists. Flags win over --config.",
    )
    group.add_argument(
        "--dtype", choices=DTYPES, help="target type (default float16, or the config's)"
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


def policy_from_args(args: argparse.Namespace) -> Policy:
    overrides: dict[str, object] = {}
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
        return Policy.from_toml(args.config, **overrides)
    return Policy.from_mapping({}, where="command line", **overrides)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(
        level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)],
        format="graphamp: %(message)s",
        stream=sys.stderr,
    )
    console = Console(highlight=False)
    try:
        if args.command == "convert":
            return run_convert(args, console)
        if args.command == "demo":
            return run_demo(args, console)
        return run_lists(args, console)
    except GraphampError as exc:
        print(f"graphamp: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("graphamp: interrupted", file=sys.stderr)
        return 130


def run_convert(args: argparse.Namespace, console: Console) -> int:
    from graphamp import onnx as gonnx

    source, target = Path(args.input), Path(args.output)
    if target.resolve() == source.resolve():
        raise GraphampError(
            f"{target}: the output path is the input; graphamp never overwrites its input"
        )
    if not target.parent.is_dir():
        raise GraphampError(f"{target}: folder {target.parent} does not exist")
    policy = policy_from_args(args)
    if args.inputs and not args.verify:
        raise GraphampError("--inputs is only used with --verify")
    start = time.perf_counter()
    result = gonnx.convert(source, policy)
    gonnx.save(result.model, target)
    if args.plan:
        result.plan.save(args.plan)
    print_summary(console, result.plan, time.perf_counter() - start, source, target)
    if args.verify:
        import onnx

        original = onnx.load(str(source))
        return report_verification(console, original, onnx.load(str(target)), args, policy.dtype)
    return 0


def run_demo(args: argparse.Namespace, console: Console) -> int:
    from graphamp import onnx as gonnx
    from graphamp.models import ZOO, export_onnx

    if args.model not in ZOO:
        raise GraphampError(f"--model {args.model!r}: choose one of {', '.join(ZOO)}")
    with tempfile.TemporaryDirectory(prefix="graphamp-demo-") as tmp:
        folder = Path(args.keep) if args.keep else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        source = folder / f"{args.model}.onnx"
        target = folder / f"{args.model}.{args.dtype}.onnx"
        console.print(
            f"building [bold]{args.model}[/] ({ZOO[args.model].description}; "
            f"size {args.size}, random weights) and exporting it to ONNX ..."
        )
        export_onnx(args.model, source, args.size)
        start = time.perf_counter()
        result = gonnx.convert(source, Policy.create(args.dtype, where="demo"))
        gonnx.save(result.model, target)
        result.plan.save(folder / f"{args.model}.{args.dtype}.plan.json")
        print_summary(console, result.plan, time.perf_counter() - start, source, target)
        import onnx

        status = report_verification(
            console, onnx.load(str(source)), onnx.load(str(target)), args, args.dtype
        )
        if args.keep:
            console.print(f"models and plan kept in {folder}")
        return status


def run_lists(args: argparse.Namespace, console: Console) -> int:
    policy = (
        Policy.from_toml(args.config, **({"dtype": args.dtype} if args.dtype else {}))
        if args.config
        else Policy.create(args.dtype, where="defaults")
    )
    for name in LISTS:
        table = Table(title=f"{name} ({policy.dtype})", title_justify="left", show_lines=False)
        table.add_column("op", style="bold")
        table.add_column("reason / source")
        for op, reason in sorted(policy.lists[name].items()):
            table.add_row(op, reason)
        console.print(table)
    return 0


def print_summary(
    console: Console, plan: object, seconds: float, source: Path, target: Path
) -> None:
    from graphamp.plan import Plan

    assert isinstance(plan, Plan)
    summary = plan.summary()
    weights = plan.edits.weights
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
    console: Console, original: object, converted: object, args: argparse.Namespace, dtype: str
) -> int:
    from graphamp import verify

    feeds = verify.load_inputs(args.inputs) if args.inputs else verify.random_inputs(original)  # type: ignore[arg-type]
    rtol = args.rtol if args.rtol is not None else verify.DEFAULT_RTOL[dtype]
    report = verify.verify(
        original,
        converted,
        feeds,
        rtol=rtol,
        atol=args.atol,  # type: ignore[arg-type]
        provider=args.provider,
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


def _size(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return f"{count} B"


if __name__ == "__main__":
    sys.exit(main())
