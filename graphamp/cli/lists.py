"""``graphamp lists``: the default op lists and the reason for each."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from graphamp.cli.common import DTYPES, LISTS
from graphamp.cli.files import Files

if TYPE_CHECKING:
    from rich.console import Console

HELP = "show the default op lists and the reason for each"


def add_parser(commands: argparse._SubParsersAction, epilog: str) -> None:
    parser = commands.add_parser(
        "lists", help=HELP, description="Print the op lists a policy starts from."
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        help="target type (default float16; bfloat16 with --dialect fx_cpu, as "
        "graphamp.fx.convert defaults on a CPU)",
    )
    parser.add_argument("--config", metavar="FILE", help="show the lists after this policy file")
    parser.add_argument(
        "--dialect",
        choices=("onnx", "fx_cpu", "fx_cuda"),
        default="onnx",
        help="ONNX op lists (default), or PyTorch's (aten) lists for CPU or CUDA targets",
    )


def files(args: argparse.Namespace) -> Files:
    return Files().read("--config", args.config)


def run(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    from graphamp.policy.policy import Policy

    default = "bfloat16" if args.dialect == "fx_cpu" else "float16"
    if args.config:  # --dtype over the file's dtype over the default
        given = {"dtype": args.dtype} if args.dtype else {}
        policy = Policy.from_toml(args.config, default_dtype=default, dialect=args.dialect, **given)
    else:
        policy = Policy.create(args.dtype or default, dialect=args.dialect, where="defaults")
    for name in LISTS:
        table = Table(title=f"{name} ({policy.dtype})", title_justify="left", show_lines=False)
        table.add_column("op", style="bold")
        table.add_column("reason / source")
        for op, reason in sorted(policy.lists[name].items()):
            table.add_row(op, reason)
        console.print(table)
    return 0
