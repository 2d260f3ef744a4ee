"""Type-check graphamp with mypy, under the names the package is installed with.

    python tools/ci/typecheck.py                  # the whole package
    python tools/ci/typecheck.py passes/paint.py  # some files (their imports are followed)
    python tools/ci/typecheck.py --ignores-only tests --ignores-only tools  # as .ci/run checks

``--ignores-only FOLDER`` adds FOLDER's files to the package's (pyproject's ``files``) and
reports in them only what keeps their ``# type: ignore`` comments honest: an ignore nothing needs
(``unused-ignore``), one without an error code, and what stops mypy (a syntax error, a module
found under two names). tests/ and tools/ are not annotated throughout, so their other errors
are not reported; their ignores still have to silence something.

Any other argument is passed to mypy; the settings live in pyproject.toml (``[tool.mypy]``). Plain
``mypy`` cannot check this tree: pyproject.toml installs two top-level folders inside the
package (``passes/`` as ``graphamp.passes``, ``models/`` as ``graphamp.models``), and mypy names
a file after the folders it lies in, so ``passes/paint.py`` would be checked as a module
``passes.paint`` that nothing imports while ``graphamp.passes.paint`` stayed missing. This driver
runs mypy's own command line and build with one change: each source file under a folder of
``[tool.setuptools.package-dir]`` gets its installed module name, so errors still name the file
in the tree (and ``--ignores-only`` leaves out the messages it does not report). Exit status as
mypy's: 0 clean, 1 errors found, 2 mypy could not run.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.fscache import FileSystemCache
from mypy.main import process_options
from mypy.modulefinder import BuildSource
from mypy.util import FancyFormatter, count_stats

ROOT = Path(__file__).resolve().parents[2]


def installed_names() -> dict[Path, str]:
    """The folders pyproject.toml installs under another name, each with that package name."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        setuptools = tomllib.load(file)["tool"]["setuptools"]
    return {(ROOT / folder).resolve(): package
            for package, folder in setuptools.get("package-dir", {}).items()}


def renamed(source: BuildSource, folders: dict[Path, str]) -> BuildSource:
    """``source`` named as installed when it lies under one of ``folders``."""
    if source.path is None:
        return source
    path = Path(source.path).resolve()
    for folder, package in folders.items():
        if path.is_relative_to(folder):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            source.module = ".".join((package, *parts))
            source.base_dir = str(ROOT)
    return source


# What --ignores-only reports in its folders: the ignores' own errors.
IGNORE_CODES = ("[unused-ignore]", "[ignore-without-code]")


def split_arguments(arguments: list[str]) -> tuple[list[str], list[Path]]:
    """mypy's arguments (with the package's files and the folders added when there are any),
    and the folders given with ``--ignores-only``."""
    rest: list[str] = []
    loose: list[Path] = []
    pending = iter(arguments)
    for argument in pending:
        if argument == "--ignores-only":
            loose.append((ROOT / next(pending)).resolve())
        elif argument.startswith("--ignores-only="):
            loose.append((ROOT / argument.partition("=")[2]).resolve())
        else:
            rest.append(argument)
    if loose:
        with open(ROOT / "pyproject.toml", "rb") as file:
            files = tomllib.load(file)["tool"]["mypy"]["files"]
        rest += [str(ROOT / name) for name in files] + [str(folder) for folder in loose]
    return rest, loose


def reported(message: str, loose: list[Path]) -> bool:
    """Whether ``message`` is shown: anywhere but ``loose``, or one of an ignore's own errors,
    or a message with no line (mypy could not take the file)."""
    path, _, rest = message.partition(":")
    if not any(Path(path).resolve().is_relative_to(folder) for folder in loose):
        return True
    line = rest.partition(":")[0]
    if not line.isdigit():
        return True
    return message.endswith(IGNORE_CODES) or "[syntax]" in message


def main() -> int:
    arguments, loose = split_arguments(sys.argv[1:])
    fscache = FileSystemCache()
    sources, options = process_options(arguments, fscache=fscache)
    folders = installed_names()
    sources = [renamed(source, folders) for source in sources]
    formatter = FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    messages: list[str] = []

    def flush_errors(filename: str | None, new: list[str], serious: bool) -> None:
        shown = [message for message in new if reported(message, loose)]
        messages.extend(shown)
        for message in shown:
            print(message, file=sys.stderr if serious else sys.stdout)

    blockers = False
    try:
        build.build(sources, options, None, flush_errors, fscache, sys.stdout, sys.stderr)
    except CompileError:
        blockers = True
    errors, _, files = count_stats(messages)
    if errors or blockers:  # a stop is a failure even where its messages were left out
        print(formatter.format_error(errors, files, len(sources), blockers=blockers))
        return 2 if blockers else 1
    print(formatter.format_success(len(sources)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
