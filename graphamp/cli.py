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
  graphamp plan model.onnx --format html -o plan.html
  graphamp explain model.onnx /layers.0/attention/Softmax
  graphamp diff old.onnx new.onnx --exit-code
  graphamp check model.onnx --baseline amp-plan.json
  graphamp convert model.onnx -o model.fp16.onnx --verify
  graphamp convert model.onnx -o model.bf16.onnx --dtype bfloat16 --keep-io-types
  graphamp convert model.onnx -o out.onnx --deny Softmax --deny-name '/layers.11/*' --plan plan.json
  graphamp convert model.onnx -o out.onnx --config amp.toml --verify --inputs batch.npz
  graphamp lists --dtype bfloat16

exit status: 0 success; 1 --verify over tolerance, or diff --exit-code / check found a change;
2 bad input or option.
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

    plan = commands.add_parser(
        "plan",
        help="show the precision plan of a model without converting it",
        description="Decide precisions for MODEL and print the plan: a text table grouped by "
        "precision, the JSON plan (what CI diffs), or an HTML page of the graph coloured by "
        "precision with each node's reason on hover.",
    )
    plan.add_argument("model", metavar="MODEL", help="an ONNX model")
    plan.add_argument(
        "--format",
        choices=("text", "json", "html"),
        default="text",
        help="output format (default text)",
    )
    plan.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    add_policy_arguments(plan)

    explain = commands.add_parser(
        "explain",
        help="the chain of reasons behind one node's precision",
        description="Print why NODE of MODEL runs in the precision it does: its rule, the "
        "neighbour its colour spread through (and that one's reason, down to the rule that "
        "started it), and how each input reaches it.",
    )
    explain.add_argument("model", metavar="MODEL", help="an ONNX model")
    explain.add_argument("node", metavar="NODE", help="the node name, as in the plan")
    add_policy_arguments(explain)

    diff = commands.add_parser(
        "diff",
        help="compare the plans of two models or plan files",
        description="Show nodes whose precision changed, casts added and removed, weights whose "
        "storage changed and the summary delta between A and B, like a unified diff. A and B "
        "are ONNX models (planned with the policy flags) or plan JSON files.",
    )
    diff.add_argument("old", metavar="A", help="model or plan (.json)")
    diff.add_argument("new", metavar="B", help="model or plan (.json)")
    diff.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default text)"
    )
    diff.add_argument(
        "--exit-code",
        action="store_true",
        help="exit 1 when the plans differ (as git diff --exit-code)",
    )
    add_policy_arguments(diff)

    check = commands.add_parser(
        "check",
        help="fail when a model's plan drifted from its reviewed baseline",
        description="Plan MODEL and compare it with the baseline plan: exit 0 when equal, 1 "
        "with the diff when it drifted. Without MODEL, check every [[graphamp.check]] entry "
        "(model = ..., baseline = ...) of the --config file; paths are relative to that file.",
    )
    check.add_argument("model", metavar="MODEL", nargs="?", help="an ONNX model")
    check.add_argument("--baseline", metavar="PLAN.json", help="the reviewed plan")
    check.add_argument(
        "--update",
        action="store_true",
        help="write the current plan to the baseline instead of comparing",
    )
    add_policy_arguments(check)

    lists = commands.add_parser(
        "lists",
        help="show the default op lists and the reason for each",
        description="Print the op lists a policy starts from.",
    )
    lists.add_argument("--dtype", default="float16", choices=DTYPES, help="target type")
    lists.add_argument("--config", metavar="FILE", help="show the lists after this policy file")
    lists.add_argument(
        "--dialect",
        choices=("onnx", "fx_cpu", "fx_cuda"),
        default="onnx",
        help="ONNX op lists, or PyTorch's (aten) lists for CPU or CUDA targets",
    )
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


def dialect_of(path: str | Path) -> str:
    """ONNX files use the ONNX lists; .pt2 programs PyTorch's CPU autocast lists."""
    return "fx_cpu" if Path(path).suffix == ".pt2" else "onnx"


def policy_from_args(args: argparse.Namespace, dialect: str = "onnx") -> Policy:
    overrides: dict[str, object] = {"dialect": dialect}
    if args.dtype:
        overrides["dtype"] = args.dtype
    elif dialect == "fx_cpu" and not _config_sets_dtype(args.config):
        overrides["dtype"] = "bfloat16"  # PyTorch's CPU autocast default
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


def _config_sets_dtype(config: str | None) -> bool:
    if not config:
        return False
    import tomllib

    try:
        return "dtype" in tomllib.loads(Path(config).read_text(encoding="utf-8")).get(
            "graphamp", {}
        )
    except (OSError, tomllib.TOMLDecodeError):
        return False  # Policy.from_toml reports the file's problem


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
        if args.command == "plan":
            return run_plan(args)
        if args.command == "explain":
            return run_explain(args)
        if args.command == "diff":
            return run_diff(args)
        if args.command == "check":
            return run_check(args)
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
    policy = policy_from_args(args, dialect_of(source))
    if args.inputs and not args.verify:
        raise GraphampError("--inputs is only used with --verify")
    if source.suffix == ".pt2":
        return convert_pt2(args, console, source, target, policy)
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


def convert_pt2(
    args: argparse.Namespace, console: Console, source: Path, target: Path, policy: Policy
) -> int:
    """A torch.export program: read without pickle, converted by the PyTorch dialect, saved as
    a .pt2 program again (exported on inputs of the traced shapes)."""
    import torch

    from graphamp import fx, pt2, verify

    if target.suffix != ".pt2":
        raise GraphampError(f"{target}: a .pt2 program converts to a .pt2 file")
    start = time.perf_counter()
    program = pt2.load(source)
    module, plan = fx.convert(program, policy=policy)
    plan.model = source.name
    inputs = program.example_inputs[0]
    pt2.save(module, inputs, target)
    if args.plan:
        plan.save(args.plan)
    print_summary(console, plan, time.perf_counter() - start, source, target)
    if not args.verify:
        return 0
    if args.inputs:
        arrays = verify.load_inputs(args.inputs)
        inputs = tuple(
            torch.from_numpy(arrays[spec.arg.name])
            for spec in program.graph_signature.input_specs
            if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT
        )

    def outputs(fn: object) -> dict[str, object]:
        with torch.no_grad():
            result = fn(*inputs)  # type: ignore[operator]
        flat = result if isinstance(result, tuple | list) else (result,)
        return {f"output {i}": t.float().numpy() for i, t in enumerate(flat)}

    rtol = args.rtol if args.rtol is not None else verify.DEFAULT_RTOL[policy.dtype]
    report = verify.compare(
        outputs(program.module()),
        outputs(module),
        rtol=rtol,
        atol=args.atol,
        provider="torch (cpu)",
    )
    return show_report(console, report, rtol, args.atol)


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


def plan_of(path: str | Path, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """(graph or None, Plan) of an ONNX model, a .pt2 program, or a plan file (``.json``),
    under the policy flags of ``args``."""
    from graphamp import onnx as gonnx
    from graphamp.plan import Plan

    path = Path(path)
    if path.suffix == ".json":
        return None, Plan.load(path)
    policy = policy_from_args(args, dialect_of(path))
    if path.suffix == ".pt2":
        from graphamp import fx, pt2

        fx_graph, plan = fx.analyse(pt2.load(path), None, policy=policy)
        plan.model = path.name
        return fx_graph.graph, plan
    onnx_graph, plan, _ = gonnx.analyse(path, policy)
    return onnx_graph.graph, plan


def emit(text: str, output: str | None) -> None:
    if output:
        from graphamp.io import write_atomic

        write_atomic(Path(output), text.encode("utf-8"))
    else:
        sys.stdout.write(text)


def run_plan(args: argparse.Namespace) -> int:
    from graphamp import report

    graph, plan = plan_of(args.model, args)
    if args.format == "json":
        text = plan.to_json()
    elif args.format == "html":
        if graph is None:
            raise GraphampError(f"{args.model}: --format html needs a model, not a plan file")
        text = report.html_page(plan, graph)
    else:
        text = report.text_table(plan)
    emit(text, args.output)
    return 0


def run_explain(args: argparse.Namespace) -> int:
    from graphamp import report

    graph, plan = plan_of(args.model, args)
    sys.stdout.write(report.explain(plan, args.node, graph))
    return 0


def run_diff(args: argparse.Namespace) -> int:
    import json

    _, old = plan_of(args.old, args)
    _, new = plan_of(args.new, args)
    old.model, new.model = str(args.old), str(args.new)
    difference = old.diff(new)
    if args.format == "json":
        sys.stdout.write(json.dumps(difference.to_dict(), indent=1) + "\n")
    elif not difference.empty:
        sys.stdout.write(difference.to_text())
    return 1 if args.exit_code and not difference.empty else 0


def run_check(args: argparse.Namespace) -> int:
    if args.model:
        if not args.baseline:
            raise GraphampError("check MODEL needs --baseline PLAN.json")
        entries = [(Path(args.model), Path(args.baseline))]
    else:
        if not args.config:
            raise GraphampError(
                "check needs MODEL --baseline PLAN.json, or --config FILE with "
                "[[graphamp.check]] entries"
            )
        entries = check_entries(Path(args.config))
    drifted = 0
    for model, baseline in entries:
        drifted += check_one(model, baseline, args, update=args.update)
    return 1 if drifted else 0


def check_entries(config: Path) -> list[tuple[Path, Path]]:
    """The (model, baseline) pairs of a policy file's [[graphamp.check]] tables."""
    import tomllib

    try:
        table = tomllib.loads(config.read_text(encoding="utf-8")).get("graphamp", {})
    except FileNotFoundError:
        raise GraphampError(f"{config}: policy file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise GraphampError(f"{config}: not a valid TOML file: {exc}") from None
    checks = table.get("check", [])
    if not checks:
        raise GraphampError(
            f"{config}: no [[graphamp.check]] entries (model = ..., baseline = ...)"
        )
    entries = []
    for index, entry in enumerate(checks):
        if not isinstance(entry, dict) or not {"model", "baseline"} <= set(entry):
            raise GraphampError(
                f"{config}: [[graphamp.check]] entry {index + 1} needs 'model' and 'baseline'"
            )
        entries.append((config.parent / entry["model"], config.parent / entry["baseline"]))
    return entries


def check_one(model: Path, baseline: Path, args: argparse.Namespace, *, update: bool) -> int:
    """0 when ``model``'s plan equals ``baseline`` (or was written to it), 1 when it drifted."""
    from graphamp.plan import Plan

    _, plan = plan_of(model, args)
    plan.model = model.name
    if update:
        plan.save(baseline)
        print(f"{model}: baseline {baseline} written")
        return 0
    if not baseline.exists():
        raise GraphampError(f"{baseline}: no baseline plan; create it with --update")
    reviewed = Plan.load(baseline)
    difference = reviewed.diff(plan)
    difference.old_label, difference.new_label = f"{baseline} (baseline)", f"{model} (now)"
    if difference.empty and reviewed.to_json() == plan.to_json():
        print(f"{model}: plan matches {baseline}")
        return 0
    if difference.empty:  # only reasons, policy or counts moved: still a drift to review
        difference.summary = difference.summary or {"plan": ("baseline", "changed reasons/policy")}
    print(f"{model}: plan drifted from {baseline}; review and run with --update to accept")
    sys.stdout.write(difference.to_text())
    return 1


def run_lists(args: argparse.Namespace, console: Console) -> int:
    policy = (
        Policy.from_toml(args.config, dtype=args.dtype, dialect=args.dialect)
        if args.config
        else Policy.create(args.dtype, dialect=args.dialect, where="defaults")
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
    return show_report(console, report, rtol, args.atol)


def show_report(console: Console, report: object, rtol: float, atol: float) -> int:
    """Print a verification report as a table; 1 when an output is over tolerance."""
    table = Table(
        title=f"verification on {report.provider}, rtol {rtol:g}, atol {atol:g}",  # type: ignore[attr-defined]
        title_justify="left",
    )
    for column in ("output", "max abs error", "max rel error", "NaN/Inf", "result"):
        table.add_column(column, justify="left" if column == "output" else "right")
    for output in report.outputs:  # type: ignore[attr-defined]
        table.add_row(
            output.name,
            f"{output.max_abs_error:.3g}",
            f"{output.max_rel_error:.3g}",
            str(output.nan_inf),
            "ok" if report.passed(output) else "[red]OVER[/]",  # type: ignore[attr-defined]
        )
    console.print(table)
    if not report.ok:  # type: ignore[attr-defined]
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
