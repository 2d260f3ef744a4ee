"""Shared fixtures: the zoo models, exported once per test session; the command line run
in-process."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import CliResult

# Every pass manager in the tests checks the rules every pass keeps, between passes.
os.environ["GRAPHAMP_CHECK_INVARIANTS"] = "1"


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="session")
def zoo_model(zoo_dir: Path):
    """zoo_model(name) -> path of the small model exported to ONNX (cached)."""
    from graphamp.models import export_onnx

    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = export_onnx(name, zoo_dir / f"{name}.onnx", "small")
        return cache[name]

    return get


@pytest.fixture()
def cli(capfd: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """cli(*args) -> CliResult: ``graphamp ARGS`` run in this process by ``graphamp.cli.main``,
    as a fresh process would run it: its stdout and stderr (file descriptors too, where
    onnxruntime writes), logging configured by ``main`` alone, Python's default warning
    filters, each warning shown again."""
    from graphamp.cli import main

    def run(*args: str) -> CliResult:
        capfd.readouterr()
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        root.handlers = []  # (pytest's own: main's basicConfig would add none beside them)
        try:
            with warnings.catch_warnings():
                warnings.resetwarnings()
                for category in (
                    DeprecationWarning,
                    PendingDeprecationWarning,
                    ImportWarning,
                    ResourceWarning,
                ):
                    warnings.filterwarnings("ignore", category=category)
                try:
                    status = main(list(args))
                except SystemExit as exc:  # argparse's own exits (--help, a bad option)
                    status = exc.code if isinstance(exc.code, int) else 2 if exc.code else 0
        finally:
            root.handlers, root.level = handlers, level
        captured = capfd.readouterr()
        return CliResult(status, captured.out, captured.err)

    return run
