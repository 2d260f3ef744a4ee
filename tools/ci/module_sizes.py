"""How long graphamp's modules are: a report to read, not a rule (the architecture tests hold
the rules that matter: imports point down the stack, no import circle, no reaching into a
sibling's private names). A long module is worth a look when it does two jobs; one job in many
lines is fine.

    python tools/ci/module_sizes.py              # every module, longest first
    python tools/ci/module_sizes.py --top 20     # the 20 longest
    python tools/ci/module_sizes.py --over 400   # only those over 400 lines

Each row: lines, lines of code (not blank, not a comment, not a docstring), the module's dotted
name. The last line totals the modules listed.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Where each installed package's modules live in the tree (pyproject.toml's package-dir).
PACKAGES = {"graphamp": ROOT / "graphamp", "graphamp.passes": ROOT / "passes"}


def modules() -> dict[str, Path]:
    """Every module of graphamp by its dotted name (``graphamp.passes`` lives in passes/)."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(value.lineno, (value.end_lineno or value.lineno) + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (
            tokenize.COMMENT,
            tokenize.NL,
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.ENDMARKER,
        ):
            continue
        lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, metavar="N", help="only the N longest modules")
    parser.add_argument(
        "--over", type=int, default=0, metavar="LINES", help="only modules of more than LINES lines"
    )
    args = parser.parse_args(argv)
    rows = []
    for name, path in modules().items():
        source = path.read_text()
        rows.append((len(source.splitlines()), code_lines(source), name))
    rows = [row for row in sorted(rows, reverse=True) if row[0] > args.over][: args.top]
    for lines, code, name in rows:
        print(f"{lines:6d} {code:6d}  {name}")
    print(f"{sum(r[0] for r in rows):6d} {sum(r[1] for r in rows):6d}  {len(rows)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
