"""``graphamp explain``: the chain of reasons behind one node's precision."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from graphamp.cli.common import add_policy_arguments, plan_of
from graphamp.cli.files import Files

if TYPE_CHECKING:
    from rich.console import Console

HELP = "the chain of reasons behind one node's precision"


def add_parser(commands: argparse._SubParsersAction, epilog: str) -> None:
    parser = commands.add_parser(
        "explain",
        help=HELP,
        description="Print why NODE of MODEL runs in the precision it does: its rule, the "
        "neighbour its colour spread through (and that one's reason, down to the rule that "
        "started it), and how each input reaches it. NODE may also name a Cast the conversion "
        "inserts (its output, x__float16, or the value it casts): then why it sits there, the "
        "precisions on either side and the bytes it would move one op earlier or later. MODEL "
        "may be a plan file (a training step's plan, say).",
    )
    parser.add_argument("model", metavar="MODEL", help="a model file (.onnx, .pt2) or a plan")
    parser.add_argument(
        "node", metavar="NODE", help="the node name, as in the plan, or an inserted Cast's output"
    )
    add_policy_arguments(parser)


def files(args: argparse.Namespace) -> Files:
    return Files().read_model("the model MODEL", args.model).read("--config", args.config)


def run(args: argparse.Namespace, console: Console) -> int:
    from graphamp.plans import report

    graph, plan = plan_of(args.model, args)
    sys.stdout.write(report.explain(plan, args.node, graph))
    return 0
