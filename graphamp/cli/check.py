"""``graphamp check``: fail when a model's plan drifted from its reviewed baseline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from graphamp.cli.common import add_policy_arguments, plan_of
from graphamp.cli.files import Files
from graphamp.cli.numerics import add_calibrate_argument, add_fp8_arguments
from graphamp.core.text import printable
from graphamp.errors import GraphampError, did_you_mean

if TYPE_CHECKING:
    from rich.console import Console

    from graphamp.cli.folder import FolderRules

HELP = "fail when a model's plan drifted from its reviewed baseline"


def add_parser(commands: argparse._SubParsersAction, epilog: str) -> None:
    parser = commands.add_parser(
        "check",
        help=HELP,
        description="Plan MODEL and compare it with the baseline plan: exit 0 when equal, 1 "
        "with the diff when it drifted. Without MODEL, check every [[graphamp.check]] entry "
        "(model = ..., baseline = ...) of the --config file; paths are relative to that file. "
        "A folder MODEL checks each model file in it against its plan in the baseline folder "
        "(decoder_model.onnx against decoder_model.plan.json, as convert --plan PLANDIR names "
        "them); a baseline there whose model is gone is a drift too.",
    )
    parser.add_argument(
        "model", metavar="MODEL", nargs="?", help="a model file (.onnx, .pt2) or a folder"
    )
    parser.add_argument(
        "--baseline",
        metavar="PLAN.json",
        help="the reviewed plan (for a folder MODEL, the folder of plans)",
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="write the current plan to the baseline instead of comparing",
    )
    add_policy_arguments(parser)
    add_calibrate_argument(parser)
    add_fp8_arguments(parser)


def given_entries(args: argparse.Namespace) -> list[tuple[Path, Path]]:
    """The (model, baseline) pairs given: MODEL --baseline, or the --config file's (a model
    may be a folder, its baseline a folder of plans)."""
    if args.model:
        if not args.baseline:
            raise GraphampError("check MODEL needs --baseline PLAN.json")
        return [(Path(args.model), Path(args.baseline))]
    if not args.config:
        raise GraphampError(
            "check needs MODEL --baseline PLAN.json, or --config FILE with "
            "[[graphamp.check]] entries"
        )
    return check_entries(Path(args.config))


def entries_of(args: argparse.Namespace) -> list[tuple[Path, Path]]:
    """The (model file, baseline plan) pairs to check, a folder's models each on its own."""
    from graphamp.cli.folder import plan_pairs

    return [pair for model, baseline in given_entries(args) for pair in plan_pairs(model, baseline)]


def files(args: argparse.Namespace) -> Files:
    files = Files(new_folders=True).read("--config", args.config)  # --update makes folders
    files.read("--calibrate", args.calibrate)
    for index, (model, baseline) in enumerate(entries_of(args)):
        what = "MODEL" if args.model else f"entry {index + 1}'s model"
        files.read_model(f"the model {what}", model)
        if args.update:
            files.write(
                "--update's baseline" if args.model else f"entry {index + 1}'s baseline", baseline
            )
        else:
            files.read("--baseline", baseline)
    return files


def run(args: argparse.Namespace, console: Console) -> int:
    from contextlib import nullcontext

    from graphamp.cli.folder import FolderRules, orphan_plans, plan_pairs

    drifted = 0
    orphans: list[Path] = []
    # A config's entries are one set of models, as a folder's are: a rule is unmatched (a
    # warning, an error with --strict) only if no model of any entry matches it.
    entries = given_entries(args)
    every = None if args.model else _config_rules(Path(args.config), args)
    for model, baseline in entries:
        rules = every or (FolderRules(model, args) if model.is_dir() else None)
        for file, plan in plan_pairs(model, baseline):
            with rules.model() if rules else nullcontext():
                drifted += check_one(file, plan, rules.args if rules else args)
        if rules and rules is not every:
            rules.report()
        for orphan in orphan_plans(model, baseline):
            gone = f"{orphan}: a baseline plan whose model is not in {model} (gone or renamed)"
            print(printable(gone))
            orphans.append(orphan)
            drifted += 0 if args.update else 1
    if every:
        every.report()
    if args.update:  # every plan made: the baselines are moved into place together
        for model, baseline in entries_of(args):
            print(printable(f"{model}: baseline {baseline} written"))
        for orphan in orphans:  # accepted as gone: left, the next check would fail on it
            orphan.unlink()
            print(printable(f"{orphan}: removed (its model is gone)"))
    return 1 if drifted else 0


def _config_rules(config: Path, args: argparse.Namespace) -> FolderRules:
    """The policy's rules over every model a config's ``[[graphamp.check]]`` entries name."""
    from graphamp.cli.folder import FolderRules

    return FolderRules(config, args, f"any model of {config}'s [[graphamp.check]] entries")


def check_entries(config: Path) -> list[tuple[Path, Path]]:
    """The (model, baseline) pairs of a policy file's [[graphamp.check]] tables."""
    from graphamp.policy.config import read_table

    checks = read_table(config).get("check", [])
    if not checks:
        raise GraphampError(
            f"{config}: no [[graphamp.check]] entries (model = ..., baseline = ...)"
        )
    if not isinstance(checks, list):
        raise GraphampError(f"{config}: 'check' must be [[graphamp.check]] tables")
    entries = []
    for index, entry in enumerate(checks):
        where = f"{config}: [[graphamp.check]] entry {index + 1}"
        if not isinstance(entry, dict):
            raise GraphampError(f"{where} is no table (model = ..., baseline = ...)")
        unknown = sorted(set(entry) - {"model", "baseline"})
        if unknown:
            hint = did_you_mean(unknown[0], ["model", "baseline"])
            raise GraphampError(f"{where}: unknown key {unknown[0]!r}{hint}")
        if not {"model", "baseline"} <= set(entry):
            raise GraphampError(f"{where} needs 'model' and 'baseline'")
        entries.append((config.parent / entry["model"], config.parent / entry["baseline"]))
    return entries


def check_one(model: Path, baseline: Path, args: argparse.Namespace) -> int:
    """0 when ``model``'s plan equals ``baseline`` (or was staged to be written to it, with
    ``--update``: every baseline is moved into place when all are planned), 1 when it
    drifted."""
    from graphamp.plans.plan import Plan
    from graphamp.plans.plandiff import record_changes, same_record

    _, plan = plan_of(model, args)
    plan.model = model.name
    if args.update:
        plan.save(args.outputs.path(baseline))
        return 0
    if not baseline.exists():
        raise GraphampError(f"{baseline}: no baseline plan; create it with --update")
    reviewed = Plan.load(baseline)
    difference = reviewed.diff(plan)
    difference.old_label, difference.new_label = f"{baseline} (baseline)", f"{model} (now)"
    if difference.empty and same_record(reviewed, plan):
        print(printable(f"{model}: plan matches {baseline}"))
        return 0
    if difference.empty:  # only reasons, ops, the policy or the file name moved: name them
        difference.summary = difference.summary or record_changes(reviewed, plan)
    drift = f"{model}: plan drifted from {baseline}; review and run with --update to accept"
    print(printable(drift))
    sys.stdout.write(difference.to_text())
    return 1
