"""The ``graphamp`` command line: a parser, and one module per command.

Each command module has ``HELP``, ``add_parser(commands, epilog)`` and ``run(args, console)``;
:data:`COMMANDS` lists them in the order ``--help`` shows. Exit status: 0 success; 1 a verify
over tolerance or a plan that drifted; 2 bad input or option; 3 an internal error.

Building the parser imports nothing heavy (no numpy, onnx, onnx_ir, onnxruntime, rich or
torch): ``graphamp --help`` answers at once, and each command imports what it uses when it
runs. ``tests/cli/test_cli_imports.py`` holds every command's ``--help`` to that.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, TextIO

from graphamp import __version__
from graphamp.cli import check, convert, debug, demo, diff, explain, lists, plan, tune
from graphamp.cli.parser import Parser, refuse_a_report_named_as_a_model, resolve_format
from graphamp.core.text import printable
from graphamp.errors import (
    DataWarning,
    GraphampError,
    PolicyWarning,
    RepairWarning,
    SlowPrecisionWarning,
)

if TYPE_CHECKING:
    from rich.console import Console

COMMANDS: dict[str, ModuleType] = {
    "convert": convert,
    "demo": demo,
    "plan": plan,
    "explain": explain,
    "diff": diff,
    "check": check,
    "lists": lists,
    "debug": debug,
    "tune": tune,
}

EXAMPLES = """\
examples:
  graphamp demo
  graphamp plan model.onnx --format html -o plan.html
  graphamp explain model.onnx /layers.0/attention/Softmax
  graphamp diff old.onnx new.onnx --exit-code
  graphamp check model.onnx --baseline amp-plan.json
  graphamp convert model.onnx -o model.fp16.onnx --verify
  graphamp convert model.onnx -o model.bf16.onnx --dtype bfloat16 --keep-io-types
  graphamp convert model.onnx -o out.onnx --deny Softmax --deny-name '/layers.11/*' --plan plan.json
  graphamp convert model.onnx -o out.onnx --from-plan reviewed.plan.json
  graphamp convert model.onnx -o out.onnx --config amp.toml --verify --inputs batch.npz
  graphamp convert model.onnx -o out.onnx --calibrate data/ --verify --inputs data/
  graphamp debug model.onnx model.fp16.onnx --inputs batch.npz
  graphamp tune model.onnx -o model.tuned.onnx --inputs data/ --rtol 0.01
  graphamp lists --dtype bfloat16

exit status: 0 success; 1 --verify over tolerance, or diff --exit-code / check found a change;
2 bad input or option; 3 internal error (a bug: please report it).
"""

REPORT = (
    "this is a bug in graphamp: please report it with the command and the model (-v shows where)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="graphamp",
        description="Static-graph automatic mixed precision: converts a float32 model so that "
        "each op computes in float16/bfloat16 or stays float32, with the fewest casts and a "
        "reason for every decision.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log each pass (-vv: every decision) to stderr, check the passes' invariants, "
        "and show the traceback of an internal error",
    )
    parser.add_argument("--version", action="version", version=f"graphamp {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module in COMMANDS.values():
        module.add_parser(commands, EXAMPLES)
    for command in commands.choices.values():  # -v after the command counts as before it
        command.add_argument(
            "-v",
            "--verbose",
            dest="verbose_after",
            action="count",
            default=0,
            help="as graphamp -v: log each pass (-vv: every decision) to stderr",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    args.verbose += args.verbose_after
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_PrintableFormatter("graphamp: %(message)s"))
    logging.basicConfig(
        level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)],
        handlers=[handler],
    )
    warnings.showwarning = _one_line_warning
    from rich.console import Console

    console = Console(highlight=False)
    try:
        _refuse_empty_values(list(sys.argv[1:] if argv is None else argv))
        resolve_format(args)
        return _run(COMMANDS[args.command], args, console)
    except GraphampError as exc:
        print(f"graphamp: error: {printable(str(exc))}", file=sys.stderr)
        return 2
    except PermissionError as exc:  # the user's file or folder: theirs to grant, not a bug
        where = exc.filename or "a file"
        print(f"graphamp: error: {where}: permission denied; nothing was written", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("graphamp: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (graphamp plan DIR | head): as SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141
    except Exception as exc:  # a bug: one line, the traceback under -v
        if args.verbose:
            traceback.print_exc()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(
            f"graphamp: internal error: {type(exc).__name__}: {printable(first[:300])}; {REPORT}",
            file=sys.stderr,
        )
        return 3


def _refuse_empty_values(argv: list[str]) -> None:
    """An empty value is a mistake, most often an unset variable in a CI script: taken as it
    came, ``--from-plan ''`` decided afresh without a word and ``-o ''`` wrote a folder's
    models into the current folder."""
    for index, token in enumerate(argv):
        if token.startswith("--") and token.endswith("="):
            what = token[:-1]
        elif token == "":
            before = argv[index - 1] if index else ""
            what = before if before.startswith("-") else "an argument"
        else:
            continue
        raise GraphampError(f"{what}: an empty value (an unset variable?); nothing was done")


def _run(module: ModuleType, args: argparse.Namespace, console: Console) -> int:
    """Run a command: the files it names checked before any work (graphamp.cli.files), its
    outputs staged in ``args.outputs`` and moved into place together when it returns."""
    from graphamp.cli.files import Files
    from graphamp.core.io import Outputs

    files = module.files(args) if hasattr(module, "files") else Files()
    files.check()
    refuse_a_report_named_as_a_model(args)  # (after: a clobbered input's error is the better)
    with Outputs(files.writes) as outputs:
        args.outputs = outputs
        status = module.run(args, console)
        outputs.commit()
    return status


def _one_line_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """graphamp's own warnings as one line on stderr; others as Python prints them. A
    graphamp warning's message is :func:`printable`: it names nodes of the model."""
    ours = category.__module__ == "graphamp.errors"
    text = printable(str(message)) if ours else message
    if issubclass(category, PolicyWarning | SlowPrecisionWarning | RepairWarning | DataWarning):
        print(f"graphamp: warning: {text}", file=sys.stderr)
    else:
        _show_python_warning(text, category, filename, lineno, file, line)


_show_python_warning = warnings.showwarning


class _PrintableFormatter(logging.Formatter):
    """Log lines :func:`printable`: the names in them come from the model (a traceback under
    -v, added after, keeps its lines). A warning says so, as graphamp's warnings do."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = printable(super().formatMessage(record))
        if record.levelno >= logging.WARNING:
            line = line.replace("graphamp: ", "graphamp: warning: ", 1)
        return line


if __name__ == "__main__":
    sys.exit(main())
