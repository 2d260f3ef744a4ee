"""``graphamp convert``: convert a model file and write the result."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from graphamp.cli.common import add_policy_arguments
from graphamp.cli.files import Files
from graphamp.cli.numerics import add_calibrate_argument, add_fp8_arguments, check_fp8_flags
from graphamp.cli.verification import add_verify_arguments
from graphamp.errors import GraphampError

if TYPE_CHECKING:
    from rich.console import Console


HELP = "convert a model file (ONNX, or a .pt2 program), or every model file of a folder"


def add_parser(commands: argparse._SubParsersAction, epilog: str) -> None:
    parser = commands.add_parser(
        "convert",
        help=HELP,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Convert IN (a float32 ONNX model or .pt2 program) to mixed precision and "
        "write OUT. The input is never modified; OUT is written atomically, and not at all on "
        "error. IN may be a folder (an Optimum export, say): every model file in it (and below "
        "it) is converted into the folder OUT under the same flags, with its external data "
        "beside it, and every other file (config, tokenizer, generation config) is copied; all "
        "of OUT is moved into place together once every model is written.",
    )
    parser.add_argument(
        "input", metavar="IN", help="the float32 model (.onnx or .pt2), or a folder of them"
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        required=True,
        help="where to write the converted model (not IN itself; its suffix, if it has a "
        "model's, names IN's format: .onnx for an ONNX model); for a folder IN, the folder to "
        "write (made if missing; not IN nor inside it, no model suffix)",
    )
    add_policy_arguments(parser)
    parser.add_argument(
        "--plan",
        metavar="PLAN.json",
        help="also write the precision plan (every decision and its reason) as JSON; for a "
        "folder IN, a folder that gets one plan per model (decoder_model.onnx -> "
        "decoder_model.plan.json)",
    )
    parser.add_argument(
        "--from-plan",
        metavar="PLAN.json",
        help="apply exactly this reviewed plan (its decisions and its policy) instead of "
        "deciding again; refused, naming the first difference, when the model no longer "
        "matches it. For a folder IN, the folder of plans --plan wrote, one per model",
    )
    parser.add_argument(
        "--no-runtime-check",
        action="store_true",
        help="skip the check that onnxruntime loads the output whenever it loads the input "
        "(done below 512 MiB; a refusal is exit 3 and nothing is written)",
    )
    add_calibrate_argument(parser)
    add_fp8_arguments(parser)
    add_verify_arguments(parser, flag=True)


def files(args: argparse.Namespace) -> Files:
    if Path(args.input).is_dir():
        from graphamp.cli.folder import folder_files

        return folder_files(args)
    return (
        Files()
        .read_model("the model IN", args.input)
        .read("--inputs", args.inputs)
        .read("--calibrate", args.calibrate)
        .read("--config", args.config)
        .read("--from-plan", args.from_plan)
        .write_model("-o", args.output, args.input)
        .write("--plan", args.plan)
    )


def run(args: argparse.Namespace, console: Console) -> int:
    from graphamp.core import progress

    if (args.inputs or args.rtol is not None or args.atol or args.provider) and not args.verify:
        raise GraphampError("--inputs, --rtol, --atol and --provider are only used with --verify")
    args.provider = args.provider or "cpu"
    check_fp8_flags(args)
    if args.fp8 and args.from_plan:
        raise GraphampError("--from-plan applies the plan's own float8 settings: drop --fp8")
    if Path(args.input).is_dir():
        from graphamp.cli.folder import convert_folder

        return convert_folder(args, console)
    from graphamp.cli.conversion import convert_model, terminate_as_interrupt

    # A progress bar for the long parts (scanning and writing weights) when stderr is a
    # terminal; SIGTERM unwinds like Ctrl-C, so the staged files are removed either way.
    with progress.reporting(progress.for_terminal()), terminate_as_interrupt():
        result, status = convert_model(
            args, console, Path(args.input), Path(args.output), args.from_plan
        )
    if args.plan:
        result.plan.save(args.outputs.path(args.plan))
    return status
