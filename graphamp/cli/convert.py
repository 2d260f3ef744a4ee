"""``graphamp convert``: convert a model file and write the result."""

from __future__ import annotations

import argparse
import functools
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from graphamp.cli.common import (
    add_policy_arguments,
    add_verify_arguments,
    policy_flags_given,
    policy_from_args,
    policy_options,
    report_verification,
    verification_inputs,
)
from graphamp.cli.files import Files
from graphamp.cli.numerics import add_calibrate_argument, calibrated
from graphamp.cli.summary import nothing_converted, print_summary
from graphamp.errors import GraphampError, WeightOverflow

if TYPE_CHECKING:
    from rich.console import Console

    from graphamp import engine
    from graphamp.plan import Plan
    from graphamp.policy import Policy

HELP = "convert a model file (ONNX, or a .pt2 program)"


def add_parser(commands: argparse._SubParsersAction, epilog: str) -> None:
    parser = commands.add_parser(
        "convert",
        help=HELP,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Convert IN (a float32 ONNX model or .pt2 program) to mixed precision and "
        "write OUT. The input is never modified; OUT is written atomically, and not at all on "
        "error.",
    )
    parser.add_argument("input", metavar="IN", help="the float32 model (.onnx or .pt2)")
    parser.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        required=True,
        help="where to write the converted model (not IN itself)",
    )
    add_policy_arguments(parser)
    parser.add_argument(
        "--plan",
        metavar="PLAN.json",
        help="also write the precision plan (every decision and its reason) as JSON",
    )
    parser.add_argument(
        "--from-plan",
        metavar="PLAN.json",
        help="apply exactly this reviewed plan (its decisions and its policy) instead of "
        "deciding again; refused, naming the first difference, when the model no longer "
        "matches it",
    )
    parser.add_argument(
        "--no-runtime-check",
        action="store_true",
        help="skip the check that onnxruntime loads the output whenever it loads the input "
        "(done below 512 MiB; a refusal is exit 3 and nothing is written)",
    )
    add_calibrate_argument(parser)
    add_verify_arguments(parser, flag=True)


def files(args: argparse.Namespace) -> Files:
    return (
        Files()
        .read_model("the model IN", args.input)
        .read("--inputs", args.inputs)
        .read("--calibrate", args.calibrate)
        .read("--config", args.config)
        .read("--from-plan", args.from_plan)
        .write_model("-o", args.output, args.input)
        .write("--plan", args.plan)
    )


def run(args: argparse.Namespace, console: Console) -> int:
    from graphamp import engine, progress
    from graphamp.dialects.registry import for_file
    from graphamp.plan import Plan

    source, target = Path(args.input), Path(args.output)
    if (args.inputs or args.rtol is not None or args.atol) and not args.verify:
        raise GraphampError("--inputs, --rtol and --atol are only used with --verify")
    dialect = for_file(source)
    dialect.check_target(target)
    options = policy_options(args)
    reviewed = None
    if args.from_plan:
        given = policy_flags_given(args)
        if given:
            raise GraphampError(f"--from-plan applies the plan's own policy: drop {given[0]}")
        reviewed = Plan.load(args.from_plan)
        policy = engine.reviewed_policy(reviewed, args.from_plan)
        options["reviewed_where"] = args.from_plan
    else:
        policy = policy_from_args(args, dialect)
    if args.calibrate and reviewed is not None:
        raise GraphampError("--from-plan applies the plan's decisions: drop --calibrate")
    # Inputs are checked before any work, so a bad --inputs file writes nothing.
    feeds = verification_inputs(dialect, source, args) if args.verify else None
    start = time.perf_counter()
    ranges = calibrated(dialect, source, args)
    if ranges is not None:
        options["ranges"] = ranges
    # A progress bar for the long parts (scanning and writing weights) when stderr is a
    # terminal; SIGTERM unwinds like Ctrl-C, so the staged files are removed either way.
    with progress.reporting(progress.for_terminal()), _terminate_as_interrupt():
        # Weights on disk are range-checked while they are written (read once, not twice);
        # should one overflow, nothing was kept, and the conversion starts over with every
        # weight checked first (it then stays float32 with its readers, as always).
        attempt = functools.partial(
            _convert_and_write, args, console, policy, options, reviewed, feeds, start
        )
        try:
            # (a reviewed plan is compared with the analysis, counts included: no deferring)
            result, status = attempt(speculate=reviewed is None)
        except WeightOverflow as miss:
            print(
                f"graphamp: {miss.weight!r} holds values beyond {policy.dtype}: checking every"
                " weight before converting",
                file=sys.stderr,
            )
            result, status = attempt(speculate=False)
    if args.plan:
        result.plan.save(args.outputs.path(args.plan))
    return status


def _convert_and_write(
    args: argparse.Namespace,
    console: Console,
    policy: Policy,
    options: dict[str, object],
    reviewed: Plan | None,
    feeds: object,
    start: float,
    *,
    speculate: bool,
) -> tuple[engine.Conversion, int]:
    """Convert, write OUT (staged: moved into place only when everything below succeeded),
    print the summary and verify; (the conversion, the exit status). With ``speculate``,
    weights on disk are range-checked as they are written (WeightOverflow on a miss)."""
    from graphamp import engine
    from graphamp.dialects.registry import for_file

    source, target = Path(args.input), Path(args.output)
    dialect = for_file(source)
    options = {**options, "speculate_weights": speculate}
    result = engine.convert(source, policy, dialect=dialect, reviewed=reviewed, options=options)
    status = 0
    # Written beside OUT (args.outputs) and moved into place, with the plan, when the command
    # returns: an error leaves no output. Over tolerance (exit 1) the model is kept.
    path = args.outputs.path(target)
    try:
        dialect.save(result.model, path)
    except GraphampError as exc:  # name OUT, not the folder it is staged in
        raise GraphampError(str(exc).replace(str(path), str(target))) from None
    if not args.no_runtime_check:
        for warning in dialect.check_runtime(source, path):
            print(f"graphamp: warning: {warning}", file=sys.stderr)
    print_summary(console, result.plan, time.perf_counter() - start, source, target)
    note = nothing_converted(result.plan)
    if note:
        print(f"graphamp: warning: {note}", file=sys.stderr)
    if feeds is not None:
        status = report_verification(
            console, dialect, source, path, args, policy.dtype, feeds=feeds
        )
    return result, status


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt for the block (in the main thread), so that a killed
    conversion cleans up its temporary files as an interrupted one does."""
    try:
        previous = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
