"""``graphamp demo``: build a zoo model in code, convert it and verify it."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from graphamp.cli.common import DTYPES
from graphamp.cli.files import Files
from graphamp.cli.summary import print_summary
from graphamp.cli.verification import (
    add_verify_arguments,
    report_verification,
    verification_inputs,
)
from graphamp.errors import GraphampError

if TYPE_CHECKING:
    from rich.console import Console

HELP = "convert a bundled model and verify it (no arguments needed)"


def add_parser(commands: argparse._SubParsersAction, epilog: str) -> None:
    parser = commands.add_parser(
        "demo",
        help=HELP,
        description="Build a model of the models/ zoo in code (random weights), convert it, "
        "print the summary and verify it against float32 on onnxruntime.",
    )
    parser.add_argument(
        "--model",
        default="mnist",
        help="zoo model: simplenet, mnist, resnet, bert, gpt (default: mnist)",
    )
    parser.add_argument(
        "--size", default="small", choices=("small", "full"), help="model size (default: small)"
    )
    parser.add_argument(
        "--dtype", default="float16", choices=DTYPES, help="target type (default float16)"
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="keep the float32 and converted models and the plan in DIR (made, with its "
        "parents, if missing)",
    )
    add_verify_arguments(parser, flag=False)


def _kept(args: argparse.Namespace) -> list[str]:
    """The names of the files ``--keep DIR`` keeps."""
    return [
        f"{args.model}.onnx",
        f"{args.model}.{args.dtype}.onnx",
        f"{args.model}.{args.dtype}.plan.json",
    ]


def files(args: argparse.Namespace) -> Files:
    files = Files(new_folders=True)
    if args.keep:
        if Path(args.keep).exists() and not Path(args.keep).is_dir():
            raise GraphampError(
                f"--keep {args.keep}: is a file; name a folder to keep the models in"
            )
        for name in _kept(args):
            files.write_model("--keep", Path(args.keep) / name, Path(args.keep) / name)
    return files


def run(args: argparse.Namespace, console: Console) -> int:
    import shutil

    from graphamp import engine
    from graphamp.models import ZOO, export_onnx
    from graphamp.onnx.dialect.plugin import OnnxDialect
    from graphamp.policy.policy import Policy

    if args.model not in ZOO:
        raise GraphampError(f"--model {args.model!r}: choose one of {', '.join(ZOO)}")
    args.provider = args.provider or "cpu"
    OnnxDialect().check_provider(args.provider)  # before the model is built and converted
    with tempfile.TemporaryDirectory(prefix="graphamp-demo-") as tmp:
        folder = Path(tmp)
        source = folder / f"{args.model}.onnx"
        target = folder / f"{args.model}.{args.dtype}.onnx"
        console.print(
            f"building [bold]{args.model}[/] ({ZOO[args.model].describe(args.size)}; "
            f"size {args.size}, random weights) and exporting it to ONNX ..."
        )
        export_onnx(args.model, source, args.size)
        dialect = OnnxDialect()
        if args.inputs:  # checked against the model before it is converted, as convert does
            verification_inputs(dialect, source, args)
        start = time.perf_counter()
        policy = Policy.create(args.dtype, where="demo")
        result = engine.convert(source, policy, dialect=dialect)
        dialect.save(result.model, target)
        result.plan.save(folder / f"{args.model}.{args.dtype}.plan.json")
        seconds = time.perf_counter() - start
        print_summary(console, result.plan, seconds, source, target, result)
        status = report_verification(console, dialect, source, target, args, args.dtype)
        if args.keep:  # staged: moved into DIR together when the command returns
            for made in sorted(folder.iterdir()):
                shutil.move(made, args.outputs.path(Path(args.keep) / made.name))
            console.print(f"models and plan kept in {args.keep}")
        return status
