"""The one reader of graphamp's TOML files: the ``[graphamp]`` table of a policy file."""

from __future__ import annotations

import tomllib
from pathlib import Path

from graphamp.errors import GraphampError


def parse(text: str, where: str) -> dict[str, object]:
    """The TOML document ``text``; bad TOML is a :class:`GraphampError` naming ``where``."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise GraphampError(f"{where}: not a valid TOML file: {exc}") from None
    except RecursionError:  # a hostile file: a = [[[[...]]]] past Python's stack
        raise GraphampError(f"{where}: not a valid TOML file: nested too deeply") from None


def read_table(path: str | Path) -> dict[str, object]:
    """The ``[graphamp]`` table of the TOML file at ``path``.

    A missing file, bad TOML or a file without the table is a :class:`GraphampError` naming
    the file.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GraphampError(f"{path}: policy file not found") from None
    except IsADirectoryError:
        raise GraphampError(f"{path}: is a folder, not a policy file") from None
    except PermissionError:
        raise GraphampError(f"{path}: permission denied: cannot read the policy file") from None
    except UnicodeDecodeError as exc:
        raise GraphampError(f"{path}: not a valid TOML file: {exc}") from None
    table = parse(text, str(path)).get("graphamp")
    if not isinstance(table, dict):
        raise GraphampError(f"{path}: no [graphamp] table")
    return table
