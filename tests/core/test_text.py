"""What graphamp prints of a model's names: control characters escaped."""

from __future__ import annotations

from graphamp.core.text import printable, printable_lines


def test_printable_escapes_what_drives_a_terminal_or_splits_a_line():
    assert (
        printable("/layers.0/attention/Softmax é 中 \\x") == "/layers.0/attention/Softmax é 中 \\x"
    )
    assert printable("\x1b]0;t\x07\x1b[31mred") == "\\x1b]0;t\\x07\\x1b[31mred"
    assert printable("a\nb\rc\td\x7f\x9b\u2028\u202e") == "a\\nb\\rc\\td\\x7f\\x9b\\u2028\\u202e"


def test_printable_lines_keeps_its_own_newlines_only():
    assert printable_lines(["one\nforged", "two"]) == "one\\nforged\ntwo\n"
