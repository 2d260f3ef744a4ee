"""Converting one model file and writing it: what ``graphamp convert`` does for a model, and
for each model of a folder (:mod:`graphamp.cli.folder`)."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from graphamp.cli.common import policy_flags_given, policy_from_args, policy_options, shown
from graphamp.cli.numerics import calibrated, float8_option
from graphamp.cli.summary import nothing_converted, print_summary
from graphamp.cli.verification import float32_outputs, report_verification, verification_inputs
from graphamp.errors import GraphampError

if TYPE_CHECKING:
    import numpy as np
    from rich.console import Console

    from graphamp import engine
    from graphamp.dialects.base import Dialect
    from graphamp.passes.options import Options
    from graphamp.plans.plan import Plan
    from graphamp.policy.policy import Policy

    Feeds = dict[str, np.ndarray]


def convert_model(
    args: argparse.Namespace,
    console: Console,
    source: Path,
    target: Path,
    from_plan: str | Path | None,
    *,
    label: str = "",
) -> tuple[engine.Conversion, int]:
    """Convert ``source`` under the flags of ``args`` (or the reviewed plan ``from_plan``) and
    write it to ``target``, staged in ``args.outputs``; (the conversion, the exit status). The
    summary table is printed when ``label`` is empty (one model); a folder's conversion passes
    the file's name as ``label``, which then starts each warning, and prints one table."""
    from graphamp import engine
    from graphamp.dialects.registry import for_file
    from graphamp.plans.plan import Plan

    dialect = for_file(source)
    dialect.check_target(target)
    options = policy_options(args)
    reviewed = None
    if from_plan:
        given = policy_flags_given(args)
        if given:
            raise GraphampError(f"--from-plan applies the plan's own policy: drop {given[0]}")
        reviewed = Plan.load(from_plan)
        policy = engine.reviewed_policy(reviewed, str(from_plan))
        options = dataclasses.replace(options, reviewed_where=str(from_plan))
    else:
        policy = policy_from_args(args, dialect)
    if args.calibrate and reviewed is not None:
        raise GraphampError("--from-plan applies the plan's decisions: drop --calibrate")
    # The provider and inputs are checked before any work, so a bad --inputs file or a
    # --provider this machine lacks writes nothing; so is the float32 model's run on the
    # first batch (kept: verification compares with it).
    if args.verify:
        dialect.check_provider(args.provider)
    feeds = verification_inputs(dialect, source, args) if args.verify else None
    reference = float32_outputs(dialect, source, feeds, args) if feeds is not None else None
    start = time.perf_counter()
    fp8 = float8_option(args, dialect, source)
    if fp8 is not None:
        options = dataclasses.replace(options, fp8=fp8)
    ranges = calibrated(dialect, source, args, histograms=fp8 is not None)
    if ranges is not None:
        options = dataclasses.replace(options, ranges=ranges)
    verification = (feeds, reference)
    return _convert_and_write(
        args,
        console,
        dialect,
        policy,
        options,
        reviewed,
        verification,
        start,
        source,
        target,
        label,
    )


def _convert_and_write(
    args: argparse.Namespace,
    console: Console,
    dialect: Dialect,
    policy: Policy,
    options: Options,
    reviewed: Plan | None,
    verification: tuple[Iterable[Feeds] | None, tuple[Feeds, str] | None],
    start: float,
    source: Path,
    target: Path,
    label: str,
) -> tuple[engine.Conversion, int]:
    """Convert, write ``target`` (staged: moved into place only when the whole command
    succeeded), print the summary and verify; (the conversion, the exit status).
    ``verification``: the batches to verify on (None: no --verify) and the float32 model's
    outputs on the first."""
    from graphamp import engine

    status = 0
    # Written beside OUT (args.outputs) and moved into place, with the plan, when the command
    # returns: an error leaves no output. Over tolerance (exit 1) the model is kept.
    path = args.outputs.path(target)
    try:
        result = engine.convert_and_save(
            source, path, policy, dialect=dialect, reviewed=reviewed, options=options
        )
    except GraphampError as exc:  # name OUT, not the folder it is staged in
        raise GraphampError(str(exc).replace(str(path), str(target))) from None
    if result.rechecked:
        print(
            f"graphamp: {label}{result.rechecked!r} holds values beyond {policy.dtype}: every "
            "weight was checked before converting",
            file=sys.stderr,
        )
    if not args.no_runtime_check:
        for warning in dialect.check_runtime(source, path):
            print(f"graphamp: warning: {label}{warning}", file=sys.stderr)
    if not label:
        seconds = time.perf_counter() - start
        print_summary(console, result.plan, seconds, source, target, result)
    note = nothing_converted(result.plan)
    if note:
        print(f"graphamp: warning: {label}{note}", file=sys.stderr)
    feeds, reference = verification
    if feeds is not None:
        if label:
            console.print(f"{shown(source)}:")
        status = report_verification(
            console,
            dialect,
            source,
            path,
            args,
            policy.dtype,
            feeds=feeds,
            reference=reference,
        )
    return result, status


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
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
