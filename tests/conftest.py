"""Shared fixtures: the zoo models, exported once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Every pass manager in the tests checks the rules every pass keeps, between passes.
os.environ["GRAPHAMP_CHECK_INVARIANTS"] = "1"

ZOO_NAMES = ("simplenet", "mnist", "resnet", "bert", "gpt")


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
