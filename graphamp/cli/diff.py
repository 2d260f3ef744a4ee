"""``graphamp diff``: compare the plans of two models or plan files."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from graphamp.cli.common import add_policy_arguments, emit, plan_of, policy_flags_given
from graphamp.cli.files import Files
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
        "graph coloured by what changed (at least one of A and B must be a model).",
    )
    parser.add_argument("old", metavar="A", help="model or plan file")
    parser.add_argument("new", metavar="B", help="model or plan file")
    parser.add_argument(
        "--format",
        choices=("text", "json", "html"),
        default="text",
        help="output format (default text)",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    parser.add_argument(
        "--exit-code",
        action="store_true",
        help="exit 1 when the plans differ (as git diff --exit-code)",
    )
    add_policy_arguments(parser)


def files(args: argparse.Namespace) -> Files:
    return (
        Files()
        .read_model("A", args.old)
        .read_model("B", args.new)
        .read("--config", args.config)
        .write("-o", args.output)
    )


def run(args: argparse.Namespace, console: Console) -> int:
    from graphamp import viewer

    old_graph, old = plan_of(args.old, args)
    new_graph, new = plan_of(args.new, args)
    given = policy_flags_given(args) + (["--strict"] if args.strict else [])
    if old_graph is None and new_graph is None and given:
        print(
            f"graphamp: warning: {', '.join(given)} change nothing here: A and B are plan files, "
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
