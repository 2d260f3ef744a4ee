"""``graphamp convert DIR -o OUTDIR``: every model file of a folder converted, everything else
copied, so that OUTDIR loads wherever DIR did (an Optimum export with its config and tokenizer).

Each model is converted as ``graphamp convert`` converts one file, under the same flags; its
plan goes to ``--plan PLANDIR`` and a reviewed one is read from ``--from-plan PLANDIR``, both
named after the model (``decoder_model_merged.onnx`` -> ``decoder_model_merged.plan.json``).
Every output (models, their external data, copies, plans) is staged and moved into place
together when all are written (:class:`graphamp.core.io.Outputs`): an error, an interrupt or a
model over tolerance's neighbour failing leaves OUTDIR as it was. OUTDIR may exist: the files
written replace those of the same name, and others are left (a model file left there from
something else is a warning, since a loader that lists the folder may take it).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from graphamp.cli.common import shown
from graphamp.cli.files import Files
from graphamp.core.text import printable_lines
from graphamp.errors import GraphampError, PolicyWarning

if TYPE_CHECKING:
    from rich.console import Console

    from graphamp.dialects.folders import ModelFolder
    from graphamp.plans.plan import Plan

SUGGESTION = "; did you mean"  # how policy_check ends a message with the model's close names


def folder_files(args: argparse.Namespace) -> Files:
    """What ``convert DIR -o OUTDIR`` reads and writes, refusing what a folder cannot take."""
    from graphamp.dialects.folders import check_not_inside, check_output_folder, read_folder

    source, output = Path(args.input), Path(args.output)
    for flag, value in (("--inputs", args.inputs), ("--calibrate", args.calibrate)):
        if value:
            raise GraphampError(
                f"{flag} holds the inputs of one model: with a folder IN, convert each model "
                f"file on its own for {flag} (--verify runs every model of a folder on random "
                "inputs)"
            )
    folder = read_folder(source)
    check_output_folder(source, output, "-o")
    if args.plan:
        check_output_folder(source, Path(args.plan), "--plan")
    if args.from_plan and not Path(args.from_plan).is_dir():
        raise GraphampError(
            f"{args.from_plan}: with a folder IN, --from-plan takes the folder of reviewed "
            "plans that --plan PLANDIR wrote (one per model)"
        )
    files = (
        Files(new_folders=True)
        .read("the folder IN", source)
        .read("--config", args.config)
        .read("--from-plan", args.from_plan)
    )
    for model in folder.models:
        files.write_model("-o", output / model, source / model)
        if args.plan:
            files.write("--plan", Path(args.plan) / folder.plan_name(model))
    for other in folder.others:
        files.write("-o", output / other)
    for what, path in files.writes + files.companions:
        check_not_inside(path, source, what)
    return files


def convert_folder(args: argparse.Namespace, console: Console) -> int:
    """Convert every model of the folder IN into OUTDIR and copy the other files (module
    docstring); the exit status is the worst of the models' (1: one was over tolerance)."""
    from graphamp.cli.conversion import convert_model, terminate_as_interrupt
    from graphamp.core import progress
    from graphamp.dialects.folders import read_folder, stale_models

    source, output = Path(args.input), Path(args.output)
    folder = read_folder(source)
    reviewed = _reviewed_plans(folder, args.from_plan)
    rules = FolderRules(source, args)
    rows: list[tuple[Path, Plan, float]] = []
    status = 0
    bar = progress.folder_for_terminal(len(folder.models))
    try:
        with progress.reporting(bar), terminate_as_interrupt():
            for model in folder.models:
                bar.file(str(model))
                start = time.perf_counter()
                with rules.model():
                    result, one = convert_model(
                        rules.args,
                        console,
                        source / model,
                        output / model,
                        reviewed.get(model),
                        label=f"{source / model}: ",
                    )
                status = max(status, one)
                if args.plan:
                    plan_path = Path(args.plan) / folder.plan_name(model)
                    result.plan.save(args.outputs.path(plan_path))
                rows.append((model, result.plan, time.perf_counter() - start))
                del result  # one converted model in memory at a time
                bar.file_done()
            for other in folder.others:
                shutil.copy2(source / other, args.outputs.path(output / other))
    finally:
        bar.close()
    rules.report()
    _print_table(console, folder, output, rows)
    written = {(output / model).absolute() for model in folder.models}
    for stale in stale_models(output, written):
        print(
            f"graphamp: warning: {stale}: a model file this conversion does not write (left "
            "from before); a loader that lists the folder may load it",
            file=sys.stderr,
        )
    return status


PLAN_SUFFIXES = {"json": ".plan.json", "html": ".plan.html", "text": ".plan.txt"}


def plan_folder_files(args: argparse.Namespace) -> Files:
    """What ``plan DIR [-o FOLDER]`` reads and writes."""
    from graphamp.dialects.folders import check_not_inside, check_output_folder, read_folder

    source = Path(args.model)
    if args.calibrate:
        raise GraphampError(
            "--calibrate holds the inputs of one model: plan each model file of the folder on "
            "its own for --calibrate"
        )
    folder = read_folder(source)
    files = Files(new_folders=True).read("the folder MODEL", source).read("--config", args.config)
    if args.format != "text" and not args.output:
        raise GraphampError(
            f"plan of a folder as {args.format} is one file per model: give -o FOLDER"
        )
    if args.output:
        check_output_folder(source, Path(args.output), "-o")
        for model in folder.models:
            files.write("-o", _plan_file(Path(args.output), model, args.format))
        for what, path in files.writes:
            check_not_inside(path, source, what)
    return files


def plan_folder(args: argparse.Namespace, console: Console) -> int:
    """``plan DIR``: each model's plan, printed in turn or written one file per model."""
    from graphamp.cli.common import plan_text
    from graphamp.dialects.folders import read_folder

    source = Path(args.model)
    rules = FolderRules(source, args)
    for model in read_folder(source).models:
        with rules.model():
            text = plan_text(source / model, rules.args)
        if args.output:
            args.outputs.write_bytes(
                _plan_file(Path(args.output), model, args.format), text.encode("utf-8")
            )
        else:
            sys.stdout.write(printable_lines([f"== {source / model}"]) + text)
    rules.report()
    return 0


def _plan_file(folder: Path, model: Path, format: str) -> Path:
    return folder / model.with_name(model.stem + PLAN_SUFFIXES[format])


def plan_pairs(model: Path, plans: Path) -> list[tuple[Path, Path]]:
    """(model file, its plan) for each model of the folder ``model`` (its plan in the folder
    ``plans``), or ``[(model, plans)]`` for a model file."""
    from graphamp.dialects.folders import read_folder

    if not model.is_dir():
        return [(model, plans)]
    if plans.exists() and not plans.is_dir():
        raise GraphampError(
            f"{plans}: is a file; with a folder of models, name a folder of plans (one per model)"
        )
    folder = read_folder(model)
    return [(model / name, plans / folder.plan_name(name)) for name in folder.models]


def orphan_plans(model: Path, plans: Path) -> list[Path]:
    """Plans in the folder ``plans`` whose model is not in the folder ``model``."""
    from graphamp.dialects.folders import PLAN_SUFFIX

    if not model.is_dir() or not plans.is_dir():
        return []
    expected = {plan for _, plan in plan_pairs(model, plans)}
    return sorted(
        path
        for path in plans.rglob(f"*{PLAN_SUFFIX}")
        if path not in expected
        and not any(p.startswith(".") for p in path.relative_to(plans).parts)
    )


def _reviewed_plans(folder: ModelFolder, plans: str | None) -> dict[Path, Path]:
    """Each model's reviewed plan in the folder ``plans`` (all present, or an error naming the
    first one missing), or nothing without ``--from-plan``."""
    if not plans:
        return {}
    found = {model: Path(plans) / folder.plan_name(model) for model in folder.models}
    for model, path in found.items():
        if not path.is_file():
            raise GraphampError(
                f"{path}: no reviewed plan for {folder.root / model} (graphamp plan "
                f"{folder.root} --format json -o {plans} writes one per model)"
            )
    return found


class FolderRules:
    """The policy's rules over a folder: one that matches nothing in one model of the folder
    (a ``--deny-name`` for the decoder, in the encoder) is no mistake, so the warning (or the
    ``--strict`` error) is for a rule that matches nothing in every model. ``args`` are the
    command's flags with ``--strict`` left to :meth:`report`; each model runs in
    :meth:`model`, which keeps its policy warnings back and shows the others as they come.
    ``models`` says which models they are in that warning (default: the folder's); the
    models of a policy file's ``[[graphamp.check]]`` entries are such a set too."""

    def __init__(self, source: Path, args: argparse.Namespace, models: str = "") -> None:
        self.source = source
        self.models = models or f"any model of {source}"
        self.strict = bool(getattr(args, "strict", False))
        self.args = argparse.Namespace(**{**vars(args), "strict": False})
        self._unmatched: dict[str, str] | None = None  # unmatched in every model so far

    @contextmanager
    def model(self) -> Iterator[None]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        here: dict[str, str] = {}
        for warning in caught:
            if issubclass(warning.category, PolicyWarning):
                message = str(warning.message).split(SUGGESTION)[0]
                here[message] = message
            else:
                warnings.showwarning(
                    warning.message, warning.category, warning.filename, warning.lineno
                )
        if self._unmatched is None:
            self._unmatched = here
        else:
            self._unmatched = {k: v for k, v in self._unmatched.items() if k in here}

    def report(self) -> None:
        """Warn (or, with ``--strict``, raise) for each rule no model matched."""
        for message in (self._unmatched or {}).values():
            text = f"{message.replace(' of the model', '')} in {self.models}"
            if self.strict:
                raise GraphampError(f"{text} (--strict)")
            warnings.warn(text, PolicyWarning, stacklevel=2)


def _print_table(
    console: Console, folder: ModelFolder, output: Path, rows: list[tuple[Path, Plan, float]]
) -> None:
    from rich import box
    from rich.table import Table

    from graphamp.core.io import size_text

    dtype = rows[0][1].dtype if rows else ""
    before = after = 0
    table = Table(box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("model", no_wrap=True)
    for column in ("matrix\nops low", "nodes\nlow", "casts\nadded", "weights", "time"):
        table.add_column(column, justify="right", no_wrap=True)
    for model, plan, seconds in rows:
        summary = plan.summary()
        nodes = plan.counts()
        low = nodes.get(plan.dtype, 0)
        model_before = sum(w.bytes_before for w in plan.weights if w.in_place)
        model_after = sum(w.bytes_after for w in plan.weights)
        before, after = before + model_before, after + model_after
        table.add_row(
            shown(model),
            f"{summary['matrix_ops_low']}/{summary['matrix_ops']}",
            f"{low}/{low + nodes.get('float32', 0)}",
            str(summary["casts_inserted"]),
            size_text(model_after),
            f"{seconds:.1f} s",
        )
    converted = f"{size_text(before)} -> {size_text(after)}"
    table.title = shown(f"{folder.root} -> {output} ({dtype}; weights converted {converted})")
    console.print(table)
    copied = ", ".join(shown(path) for path in folder.others[:6])
    more = f" and {len(folder.others) - 6} more" if len(folder.others) > 6 else ""
    if folder.others:
        files = "file" if len(folder.others) == 1 else "files"
        console.print(f"copied {len(folder.others)} other {files}: {copied}{more}")
    if folder.skipped:
        left = ", ".join(shown(path) for path in folder.skipped)
        why = "hidden, a link to a folder or to nothing, or no regular file"
        console.print(f"left out ({why}): {left}")
