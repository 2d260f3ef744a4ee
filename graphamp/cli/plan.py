"""``graphamp plan``: show a model's precision plan without converting it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from graphamp.cli.common import add_policy_arguments, emit, plan_text
from graphamp.cli.files import Files
from graphamp.cli.numerics import add_calibrate_argument, add_fp8_arguments
from graphamp.cli.parser import add_format_argument

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
        "zoom and pan, and each node's reason chain in a side panel. For a folder MODEL, "
        "each model file in it in turn (with -o, a folder that gets one file per model: "
        "decoder_model.onnx -> decoder_model.plan.json, .plan.html or .plan.txt).",
    )
    parser.add_argument(
        "model", metavar="MODEL", help="a model file (.onnx, .pt2), or a folder of them"
    )
    add_format_argument(parser, ("text", "json", "html"))
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write to FILE instead of stdout: its name's suffix chooses the format (.json, "
        ".html, else text; a model's suffix such as .onnx is refused); for a folder MODEL, a "
        "folder, made if missing",
    )
    add_policy_arguments(parser)
    add_calibrate_argument(parser)
    add_fp8_arguments(parser)


def files(args: argparse.Namespace) -> Files:
    if Path(args.model).is_dir():
        from graphamp.cli.folder import plan_folder_files

        return plan_folder_files(args)
    return (
        Files()
        .read_model("the model MODEL", args.model)
        .read("--calibrate", args.calibrate)
        .read("--config", args.config)
        .write("-o", args.output)
    )


def run(args: argparse.Namespace, console: Console) -> int:
    if Path(args.model).is_dir():
        from graphamp.cli.folder import plan_folder

        return plan_folder(args, console)
    emit(plan_text(args.model, args), args)
    return 0
