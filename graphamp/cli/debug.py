"""``graphamp debug``: where a converted ONNX model departs from its float32 original."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from graphamp.cli.common import emit
from graphamp.cli.files import Files
from graphamp.cli.numerics import add_inputs_argument, batches, require_onnx
from graphamp.cli.parser import add_format_argument, positive_int

if TYPE_CHECKING:
    from rich.console import Console

HELP = "find the node where a converted model goes wrong, and rank nodes by the error they add"


def add_parser(commands: argparse._SubParsersAction, epilog: str) -> None:
    parser = commands.add_parser(
        "debug",
        help=HELP,
        description="Run IN (float32) and CONVERTED side by side on DATA, intermediate by "
        "intermediate (the converted model through the faithful evaluator: float16/bfloat16 "
        "rounding and overflow emulated), and report the first node, in graph order, whose "
        "output is inf/NaN in CONVERTED but finite in IN, and the nodes ranked by the error "
        "they add: max|y-y32|/max|y32| of their output less that of their inputs. JSON: "
        '{"first_nonfinite": NAME or null, "nodes": [{"name", "op", "precision", "error"}, '
        '...]} worst first; an infinite error is written "inf". Exit 0.',
    )
    parser.add_argument("input", metavar="IN", help="the float32 ONNX model")
    parser.add_argument("converted", metavar="CONVERTED", help="IN converted (graphamp convert)")
    add_inputs_argument(parser, "the data to compare on")
    add_format_argument(parser, ("text", "json"))
    parser.add_argument(
        "--plan",
        metavar="PLAN.json",
        help="the conversion's plan (convert --plan): adds each node's rule to the report",
    )
    parser.add_argument(
        "--top",
        type=positive_int,
        default=15,
        metavar="N",
        help="text format: show the N nodes adding the most error (default 15)",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")


def files(args: argparse.Namespace) -> Files:
    return (
        Files()
        .read_model("the model IN", args.input)
        .read_model("the model CONVERTED", args.converted)
        .read("--inputs", args.inputs)
        .read("--plan", args.plan)
        .write("-o", args.output)
    )


def run(args: argparse.Namespace, console: Console) -> int:
    from graphamp.dialects.registry import for_file
    from graphamp.onnx.numerics.debugging import debug
    from graphamp.plans.plan import Plan

    source, converted = Path(args.input), Path(args.converted)
    for path in (source, converted):
        require_onnx(for_file(path), path, "debug")
    data = batches(for_file(source), source, args.inputs)
    plan = Plan.load(args.plan) if args.plan else None
    report = debug(source, converted, data, plan=plan)
    emit(report.to_json() if args.format == "json" else report.to_text(args.top), args)
    return 0
