"""Type-check graphamp with mypy, under the names the package is installed with.

    python tools/ci/typecheck.py                  # the whole package, as .ci/run checks it
    python tools/ci/typecheck.py passes/paint.py  # some files (their imports are followed)

Any argument is passed to mypy; the settings live in pyproject.toml (``[tool.mypy]``). Plain
``mypy`` cannot check this tree: pyproject.toml installs two top-level folders inside the
package (``passes/`` as ``graphamp.passes``, ``models/`` as ``graphamp.models``), and mypy names
a file after the folders it lies in, so ``passes/paint.py`` would be checked as a module
``passes.paint`` that nothing imports while ``graphamp.passes.paint`` stayed missing. This driver
runs mypy's own command line and build with one change: each source file under a folder of
``[tool.setuptools.package-dir]`` gets its installed module name, so errors still name the file
in the tree. Exit status as mypy's: 0 clean, 1 errors found, 2 mypy could not run.
"""

from __future__ import annotations

import sys
import time
import tomllib
from pathlib import Path

from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
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


def main() -> int:
    fscache = FileSystemCache()
    sources, options = process_options(sys.argv[1:], fscache=fscache)
    folders = installed_names()
    sources = [renamed(source, folders) for source in sources]
    formatter = FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    _, messages, blockers = run_build(sources, options, fscache, time.time(), sys.stdout,
                                      sys.stderr)
    errors, _, files = count_stats(messages)
    if errors:
        print(formatter.format_error(errors, files, len(sources), blockers=blockers))
        return 2 if blockers else 1
    print(formatter.format_success(len(sources)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
