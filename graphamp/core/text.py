"""Text from model files as graphamp prints it: :func:`printable`.

Node, tensor and file names, op types and reasons come from files graphamp did not make. Printed
raw, an escape sequence in one drives the reader's terminal (sets its title, clears it) and a
newline forges a line of a CI log (a ``plan matches`` inside a drift report, a second line
under a one-line error). So every text output escapes them, the way ``repr`` does and the
errors that quote a name with ``!r`` already did: ``\\x1b``, ``\\n``. JSON plans are escaped by
JSON itself and are left alone; the HTML viewer escapes for HTML.
"""

from __future__ import annotations

from collections.abc import Iterable


def printable(text: str) -> str:
    """``text`` with every character Python does not call printable (control characters:
    ESC, newline, carriage return, tab, DEL, the C1 range; line separators; format
    characters such as bidirectional overrides) escaped as ``repr`` escapes it; the rest,
    backslashes included, as it is."""
    if text.isprintable():  # nearly always: one pass in C
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def printable_lines(lines: Iterable[str]) -> str:
    """``lines`` as one text, each made :func:`printable` and ended by a newline: the newlines
    are the text's own, never a name's."""
    return "".join(f"{printable(line)}\n" for line in lines)
