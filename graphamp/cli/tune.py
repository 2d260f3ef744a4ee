"""``graphamp tune``: find the fewest nodes to keep float32 for a tolerance, and convert."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from graphamp.cli.common import add_policy_arguments, policy_from_args, policy_options
from graphamp.cli.files import Files
from graphamp.cli.numerics import (
    add_calibrate_argument,
    add_fp8_arguments,
    add_inputs_argument,
    batches,
    calibrated,
    check_fp8_flags,
    float8_option,
    require_onnx,
)
from graphamp.cli.parser import non_negative
from graphamp.core.text import printable

if TYPE_CHECKING:
    from rich.console import Console

    from graphamp.numerics.batches import InputBatches
    from graphamp.numerics.ranges import Ranges
    from graphamp.plans.plan import Plan
    from graphamp.policy.policy import Policy
    from graphamp.training.float8 import Float8

HELP = "find a small set of nodes to keep float32 so the model meets a tolerance, and convert"


def add_parser(commands: argparse._SubParsersAction, epilog: str) -> None:
    parser = commands.add_parser(
        "tune",
        help=HELP,
        description="Convert IN, and when the result misses the tolerance on DATA, find a "
        "small set of nodes to keep float32 so that it meets it, keeping the rest low: the "
        "nodes are ranked by the error they add (as graphamp debug ranks them), then the "
        "shortest ranked prefix that meets the tolerance is found by bisection and reduced by "
        "delta debugging, each candidate evaluated in one switchable faithful model; the "
        "result is checked on the real conversion. Writes OUT with those nodes float32 (rule "
        "'tuned' in the plan) and prints them as a policy snippet (deny_names = [...]), the "
        "number of evaluations and the time. Exit 1 when no set meets the tolerance. With --fp8 "
        "(and --calibrate) it finds instead the float8 nodes to keep in the low type: ranked "
        "by the error each adds alone, the shortest ranked prefix that meets the tolerance, "
        "each set evaluated in one float8 switchable model; rule 'fp8_tuned' in the plan, "
        "printed as --fp8-deny-names (docs/float8.md).",
    )
    parser.add_argument("input", metavar="IN", help="the float32 ONNX model")
    parser.add_argument("-o", "--output", metavar="OUT", required=True, help="the tuned model")
    add_inputs_argument(parser, "the data the tolerance must hold on")
    parser.add_argument(
        "--rtol",
        type=non_negative,
        required=True,
        metavar="R",
        help="allowed max |y - y32| / max |y32| per output and batch",
    )
    parser.add_argument(
        "--atol",
        type=non_negative,
        default=0.0,
        metavar="A",
        help="allowed max |y - y32|, passes an output on its own (default 0)",
    )
    parser.add_argument(
        "--plan", metavar="PLAN.json", help="also write the plan (tuned nodes: rule 'tuned')"
    )
    add_calibrate_argument(parser)
    add_fp8_arguments(parser)
    add_policy_arguments(parser)


def files(args: argparse.Namespace) -> Files:
    return (
        Files()
        .read_model("the model IN", args.input)
        .read("--inputs", args.inputs)
        .read("--calibrate", args.calibrate)
        .read("--config", args.config)
        .write_model("-o", args.output, args.input)
        .write("--plan", args.plan)
    )


def run(args: argparse.Namespace, console: Console) -> int:
    from graphamp.dialects.registry import for_file
    from graphamp.onnx.numerics.tuning import tune

    source, target = Path(args.input), Path(args.output)
    dialect = for_file(source)
    require_onnx(dialect, source, "tune")
    dialect.check_target(target)
    policy = policy_from_args(args, dialect)
    check_fp8_flags(args)
    fp8 = float8_option(args, dialect, source)
    data = batches(dialect, source, args.inputs)  # checked before any work
    start = time.perf_counter()
    ranges = calibrated(dialect, source, args, histograms=fp8 is not None)
    if fp8 is not None:
        assert ranges is not None  # check_fp8_flags: --fp8 needs --calibrate
        return _tune_fp8(args, console, policy, fp8, ranges, data, source, target)
    result = tune(
        source,
        data,
        rtol=args.rtol,
        atol=args.atol,
        policy=policy,
        ranges=ranges,
        options=policy_options(args),
    )
    seconds = time.perf_counter() - start
    errors = ", ".join(f"{name} {error:.3g}" for name, error in result.errors.items())
    baseline = ", ".join(f"{name} {e:.3g}" for name, e in result.baseline_errors.items())
    console.print(f"baseline ({policy.dtype}, no node kept): max rel error {baseline}")
    if not result.met:
        console.print(
            f"[red]no set of nodes meets rtol {args.rtol:g}[/] (with all {result.candidates} "
            f"candidates float32: {errors}); nothing written"
        )
        return 1
    console.print(
        f"kept float32: {len(result.kept)} of {result.candidates} low nodes; "
        f"{result.evaluations} evaluations ({result.rounds} with attribution) and "
        f"{result.real_evaluations} real conversion(s) checked in {seconds:.2f} s; "
        f"max rel error {errors}"
    )
    print(printable(result.snippet()), flush=True)
    _warn_tf32(result.kept, result.conversion.plan, policy.target, console)
    dialect.save(result.conversion.model, args.outputs.path(target))
    if args.plan:
        result.conversion.plan.save(args.outputs.path(args.plan))
    return 0


def _tune_fp8(
    args: argparse.Namespace,
    console: Console,
    policy: Policy,
    fp8: Float8,
    ranges: Ranges,
    data: InputBatches,
    source: Path,
    target: Path,
) -> int:
    """``tune --fp8``: the float8 nodes to keep in the low type
    (graphamp/onnx/numerics/fp8_tuning.py)."""
    from graphamp.dialects.registry import for_file
    from graphamp.onnx.numerics.fp8_tuning import tune_fp8

    result = tune_fp8(
        source, data, rtol=args.rtol, atol=args.atol, policy=policy, ranges=ranges, fp8=fp8
    )
    errors = ", ".join(f"{name} {error:.3g}" for name, error in result.errors.items())
    baseline = ", ".join(f"{name} {e:.3g}" for name, e in result.baseline_errors.items())
    console.print(f"baseline ({policy.dtype} + float8, no node kept): max rel error {baseline}")
    if not result.met:
        if len(result.kept) == result.candidates and fp8.kept_int8:
            why = (
                f"(with all {result.candidates} kept {policy.dtype}, their weights int8: "
                f"{errors}): the int8 weights or the low type miss it; tune without "
                "--fp8-kept-int8, or without --fp8 first"
            )
        elif len(result.kept) == result.candidates:
            why = (
                f"(with all {result.candidates} kept {policy.dtype}: {errors}): the low type "
                "itself misses it, tune without --fp8 first"
            )
        else:  # the switchable model met it, the real conversion did not
            why = f"(the real conversion with the set found: {errors})"
        console.print(
            f"[red]no set of float8 nodes meets rtol {args.rtol:g}[/] {why}; nothing written"
        )
        return 1
    console.print(
        f"kept {policy.dtype}: {len(result.kept)} of {result.candidates} float8 nodes; "
        f"{result.evaluations} sets evaluated ({result.runs} batch runs) in one switchable "
        f"model and the result converted in {result.seconds:.2f} s; max rel error {errors}"
    )
    if result.kept:
        print(printable(result.snippet()), flush=True)
    for_file(source).save(result.conversion.model, args.outputs.path(target))
    if args.plan:
        result.conversion.plan.save(args.outputs.path(args.plan))
    return 0


def _warn_tf32(kept: tuple[str, ...], plan: Plan, target: str, console: Console) -> None:
    """onnxruntime's CUDA provider runs float32 matrix ops on TF32 tensor cores by default,
    which round their inputs to float16's 10-bit mantissa: a matrix op kept float32 for its
    precision is then not, unless the session turns TF32 off."""
    from graphamp.onnx.dialect.plugin import OnnxDialect

    matrix = [name for name in kept if plan.nodes[name].op in OnnxDialect.matrix_ops]
    if matrix and target != "cpu":
        console.print(
            f"note: {len(matrix)} kept node(s) are matrix ops: on onnxruntime's CUDA provider "
            'create the session with ("CUDAExecutionProvider", {"use_tf32": "0"}); its default '
            "TF32 rounds float32 MatMul/Gemm/Conv inputs as float16 does and undoes the fix"
        )
