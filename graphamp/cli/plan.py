"""``graphamp plan``: show a model's precision plan without converting it."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from graphamp.cli.common import add_policy_arguments, emit, plan_of
from graphamp.cli.files import Files
from graphamp.cli.numerics import add_calibrate_argument
from graphamp.errors import GraphampError

if TYPE_CHECKING:
    from rich.console import Console

HELP = "show the precision plan of a model without converting it"


def add_parser(commands: argparse._SubParsersAction, epilog: str) -> None:
    parser = commands.add_parser(
        "plan",
        help=HELP,
        description="Decide precisions for MODEL and print the plan: a text table grouped by "
        "precision, the JSON plan (what CI diffs), or one self-contained HTML page: the graph "
        "folded by module path, laid out in layers, with search, precision and rule filters, "
        "zoom and pan, and each node's reason chain in a side panel.",
    )
    parser.add_argument("model", metavar="MODEL", help="a model file (.onnx, .pt2)")
    parser.add_argument(
        "--format",
        choices=("text", "json", "html"),
        default="text",
        help="output format (default text)",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    add_policy_arguments(parser)
    add_calibrate_argument(parser)


def files(args: argparse.Namespace) -> Files:
    return (
        Files()
        .read_model("the model MODEL", args.model)
        .read("--calibrate", args.calibrate)
        .read("--config", args.config)
        .write("-o", args.output)
    )


def run(args: argparse.Namespace, console: Console) -> int:
    from graphamp import report, viewer

    graph, plan = plan_of(args.model, args)
    if args.format == "json":
        text = plan.to_json()
    elif args.format == "html":
        if graph is None:
            raise GraphampError(f"{args.model}: --format html needs a model, not a plan file")
        text = viewer.plan_page(plan, graph)
    else:
        text = report.text_table(plan)
    emit(text, args)
    return 0
