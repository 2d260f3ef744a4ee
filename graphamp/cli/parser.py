"""The argument parser type of every graphamp command and the number types its flags take."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), as every graphamp error, and no abbreviated
    flags: ``--dtyp`` or ``--keep-io-type`` are refused, not guessed (a guess that a later flag
    makes ambiguous would change what an old command line means)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        hint = self._abbreviation_hint(message)
        self.exit(2, f"graphamp: error: {message}{hint} (see '{self.prog} --help')\n")

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
