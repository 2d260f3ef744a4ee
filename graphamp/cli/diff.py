"""``graphamp diff``: compare the plans of two models or plan files."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console

from graphamp.cli.common import add_policy_arguments, plan_of

HELP = "compare the plans of two models or plan files"


def add_parser(commands: argparse._SubParsersAction, epilog: str) -> None:
    parser = commands.add_parser(
        "diff",
        help=HELP,
        description="Show nodes whose precision changed, casts added and removed, weights whose "
        "storage changed and the summary delta between A and B, like a unified diff. A and B "
        "are models (planned with the policy flags) or plan JSON files.",
    )
    parser.add_argument("old", metavar="A", help="model or plan file")
    parser.add_argument("new", metavar="B", help="model or plan file")
    parser.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default text)"
    )
    parser.add_argument(
        "--exit-code",
        action="store_true",
        help="exit 1 when the plans differ (as git diff --exit-code)",
    )
    add_policy_arguments(parser)


def run(args: argparse.Namespace, console: Console) -> int:
    _, old = plan_of(args.old, args)
    _, new = plan_of(args.new, args)
    old.model, new.model = str(args.old), str(args.new)
    difference = old.diff(new)
    if args.format == "json":
        sys.stdout.write(json.dumps(difference.to_dict(), indent=1) + "\n")
    elif not difference.empty:
        sys.stdout.write(difference.to_text())
    return 1 if args.exit_code and not difference.empty else 0
