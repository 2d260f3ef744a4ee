"""The argument parser type of every graphamp command and the number types its flags take."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from graphamp.core.io import REPORT_SUFFIXES, report_format
from graphamp.errors import GraphampError


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), as every graphamp error, and no abbreviated
    flags: ``--dtyp`` or ``--keep-io-type`` are refused, not guessed (a guess that a later flag
    makes ambiguous would change what an old command line means)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        hint = self._abbreviation_hint(message)
        self.exit(
            2, f"graphamp: error: {message}{hint} (see '{self._help_prog(message)} --help')\n"
        )

    def _help_prog(self, message: str) -> str:
        """Whose help to point at: a command's own for a flag it does not know (argparse
        reports those from the top parser, which the command's parser handed them to)."""
        if not message.startswith("unrecognized arguments:"):
            return self.prog
        command = next((word for word in getattr(self, "_argv", []) if word[:1] != "-"), None)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and command in action.choices:
                return action.choices[command].prog
        return self.prog

    def _abbreviation_hint(self, message: str) -> str:
        """For an unrecognized ``--flag`` that abbreviates flags of a command: say so."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        parsers = [self]
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers += list(action.choices.values())
        known = {flag for p in parsers for flag in p._option_string_actions if flag[:2] == "--"}
        for word in message.split(":", 1)[1].split():
            longer = sorted(flag for flag in known if flag.startswith(word) and flag != word)
            if word.startswith("--") and longer:
                return f": flags are never abbreviated (did you mean {' or '.join(longer[:3])}?)"
        return ""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}")
    return value


def non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def add_format_argument(parser: argparse.ArgumentParser, choices: tuple[str, ...]) -> None:
    """``--format``, left out: what ``-o FILE``'s suffix names (``plan.json`` a JSON plan,
    not a text table under that name), else text (:func:`resolve_format`)."""
    parser.add_argument(
        "--format",
        choices=choices,
        default=None,
        help=f"output format: {', '.join(choices)} (default: what -o FILE's name says, "
        f"{' or '.join(REPORT_SUFFIXES[f] for f in choices if f in REPORT_SUFFIXES)}, else text)",
    )
    parser.set_defaults(format_choices=choices)


def resolve_format(args: argparse.Namespace) -> None:
    """Set a left-out ``--format`` from ``-o``'s suffix; a suffix naming a format the command
    does not write is one error, not a file of another format under that name."""
    choices = getattr(args, "format_choices", None)
    if choices is None or args.format is not None:
        return
    output = getattr(args, "output", None)
    named = report_format(output) if output else "text"
    if named not in choices:
        raise GraphampError(
            f"-o {output}: {args.command} writes {', '.join(choices)}, not {named}: pass "
            "--format or name the file otherwise"
        )
    args.format = named


def refuse_a_report_named_as_a_model(args: argparse.Namespace) -> None:
    """A report (a command with ``--format``) is never written under a model file's name:
    ``plan m.onnx -o m.fp16.onnx`` meant convert, and would replace a model by a table."""
    output = getattr(args, "output", None)
    if getattr(args, "format_choices", None) is None or not output:
        return
    from graphamp.dialects.registry import named_by_suffix

    model = named_by_suffix(output)
    if model is not None:
        raise GraphampError(
            f"-o {output}: {args.command} writes a report, and {model[1]} names a model file: "
            "name it .txt, .json or .html (to write a converted model: graphamp convert)"
        )
