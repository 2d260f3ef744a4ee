"""``graphamp diff``: compare the plans of two models or plan files, or of two folders of them
(each model of one folder against the model or plan of the same relative path in the other)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from graphamp.cli.common import add_policy_arguments, emit, plan_of, policy_flags_given
from graphamp.cli.files import Files
from graphamp.cli.parser import add_format_argument
from graphamp.core.text import printable_lines
from graphamp.errors import GraphampError

if TYPE_CHECKING:
    from rich.console import Console

HELP = "compare the plans of two models or plan files"


def add_parser(commands: argparse._SubParsersAction, epilog: str) -> None:
    parser = commands.add_parser(
        "diff",
        help=HELP,
        description="Show nodes whose precision changed, casts added and removed, weights whose "
        "storage changed and the summary delta between A and B, like a unified diff. A and B "
        "are models (planned with the policy flags) or plan JSON files. --format html draws one "
        "graph coloured by what changed (at least one of A and B must be a model). A and B may "
        "both be folders (of models, as graphamp convert DIR takes, or of plans, as graphamp "
        "plan DIR -o writes): each model or plan is compared with the one of the same relative "
        "path, and one present on one side only is named.",
    )
    parser.add_argument("old", metavar="A", help="model or plan file")
    parser.add_argument("new", metavar="B", help="model or plan file")
    add_format_argument(parser, ("text", "json", "html"))
    parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    parser.add_argument(
        "--exit-code",
        action="store_true",
        help="exit 1 when the plans differ (as git diff --exit-code)",
    )
    add_policy_arguments(parser)


def files(args: argparse.Namespace) -> Files:
    folders = [Path(path).is_dir() for path in (args.old, args.new)]
    if any(folders):
        if not all(folders):
            folder, other = (args.old, args.new) if folders[0] else (args.new, args.old)
            raise GraphampError(
                f"{folder}: is a folder and {other} is not: diff compares two models or plan "
                "files, or two folders of them"
            )
        if args.format == "html":
            raise GraphampError(
                f"{args.new}: --format html draws one model: not for two folders (diff each "
                "model file on its own)"
            )
        return (
            Files()
            .read("the folder A", args.old)
            .read("the folder B", args.new)
            .read("--config", args.config)
            .write("-o", args.output)
        )
    return (
        Files()
        .read_model("A", args.old)
        .read_model("B", args.new)
        .read("--config", args.config)
        .write("-o", args.output)
    )


def run(args: argparse.Namespace, console: Console) -> int:
    from graphamp import viewer

    if Path(args.old).is_dir():
        return _run_folders(args)

    old_graph, old = plan_of(args.old, args)
    new_graph, new = plan_of(args.new, args)
    given = policy_flags_given(args) + (["--strict"] if args.strict else [])
    if old_graph is None and new_graph is None and given:
        print(
            f"graphamp: warning: {', '.join(given)} change{'s' if len(given) == 1 else ''} "
            "nothing here: A and B are plan files, "
            "whose decisions are made; the policy flags apply to models",
            file=sys.stderr,
        )
    old.model, new.model = str(args.old), str(args.new)
    difference = old.diff(new)
    if args.format == "html":
        graph = new_graph or old_graph
        if graph is None:
            raise GraphampError(
                f"{args.new}: --format html needs a model as A or B to draw, not two plan files"
            )
        emit(viewer.diff_page(old, new, graph), args)
    elif args.format == "json":
        emit(json.dumps(difference.to_dict(), indent=1) + "\n", args)
    elif not difference.empty or args.output:
        emit(difference.to_text(), args)
    return 1 if args.exit_code and not difference.empty else 0


def _entries(root: Path) -> dict[Path, Path]:
    """A folder's models (or, with none, its plan files), each under the relative path of its
    plan (``decoder_model_merged.plan.json``), so that a model pairs with its plan."""
    from graphamp.dialects.folders import PLAN_SUFFIX, is_model_name, read_folder

    if any(is_model_name(path) for path in root.rglob("*") if path.is_file()):
        folder = read_folder(root)
        return {folder.plan_name(model): root / model for model in folder.models}
    plans = sorted(
        path
        for path in root.rglob(f"*{PLAN_SUFFIX}")
        if not any(part.startswith(".") for part in path.relative_to(root).parts)
    )
    if not plans:
        raise GraphampError(f"{root}: no model or plan file ({PLAN_SUFFIX}) in this folder")
    return {path.relative_to(root): path for path in plans}


def _run_folders(args: argparse.Namespace) -> int:
    """Each pair's difference in turn (text: ``== path`` then the diff, for pairs that differ;
    json: one object keyed by path); a model or plan on one side only is a difference."""
    from graphamp.cli.folder import FolderRules

    old, new = _entries(Path(args.old)), _entries(Path(args.new))
    # a rule that matches nothing in one model (a --deny-name for the decoder, in the
    # encoder) is warned about only when it matches nothing in any
    rules = FolderRules(Path(args.old), args)
    text: list[str] = []
    found: dict[str, object] = {}
    differs = False
    for key in sorted(old.keys() | new.keys()):
        if key not in new or key not in old:
            side, path = ("A", old[key]) if key in old else ("B", new[key])
            found[str(key)] = f"only in {side}: {path}"
            text.append(printable_lines([f"== {key}", f"only in {side}: {path}"]))
            differs = True
            continue
        with rules.model():
            _, before = plan_of(str(old[key]), rules.args)
            _, after = plan_of(str(new[key]), rules.args)
        before.model, after.model = str(old[key]), str(new[key])
        difference = before.diff(after)
        found[str(key)] = difference.to_dict()
        if not difference.empty:
            differs = True
            text.append(printable_lines([f"== {key}"]) + difference.to_text())
    rules.report()
    if args.format == "json":
        emit(json.dumps(found, indent=1) + "\n", args)
    elif text or args.output:
        emit("".join(text), args)
    return 1 if args.exit_code and differs else 0
