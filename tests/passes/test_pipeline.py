"""The pipelines of passes/pipeline.py: every pass in one, the decide step for every spread, and
docs/ARCHITECTURE.md's table held to the lists rather than copied from them."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import graphamp.passes
from graphamp.passes import Pass, PassManager
from graphamp.passes.base import Choice, pass_classes
from graphamp.passes.pipeline import DECIDE, DECIDING, MODEL, STEP
from graphamp.policy.policy import SPREADS

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md"


def defined_passes() -> set[type[Pass]]:
    """Every concrete Pass class the passes package defines."""
    found: set[type[Pass]] = set()
    for module in pkgutil.iter_modules(graphamp.passes.__path__):
        loaded = importlib.import_module(f"graphamp.passes.{module.name}")
        for _, value in inspect.getmembers(loaded, inspect.isclass):
            if (
                issubclass(value, Pass)
                and value.__module__ == loaded.__name__
                and not inspect.isabstract(value)
            ):
                found.add(value)
    return found


def test_every_pass_is_in_exactly_one_pipeline():
    """A pass named in no list would never run; one in both would run on the wrong graphs."""
    model, step = set(pass_classes(MODEL)), set(pass_classes(STEP))
    assert not model & step
    assert defined_passes() == model | step


def test_the_pipelines_meet_every_pass_requirement():
    for steps in (MODEL, STEP, DECIDING):
        PassManager(steps)  # refuses a pass placed before what it needs


def test_the_decide_step_has_a_pass_for_every_spread():
    assert set(DECIDE.branches) == set(SPREADS)
    assert all(len(branch) == 1 for branch in DECIDE.branches.values())


def test_the_deciding_passes_are_the_model_pipelines_own():
    """tune decides with exactly what convert runs when no reviewed plan is given."""
    (decisions,) = [step for step in MODEL if isinstance(step, Choice)]
    assert tuple(decisions.branches["new"][1:]) == DECIDING


def _table_row(pipeline: str) -> str:
    rows = [
        line
        for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines()
        if line.startswith(f"| `{pipeline}` |")
    ]
    assert len(rows) == 1, f"ARCHITECTURE.md has {len(rows)} rows for the {pipeline} pipeline"
    return rows[0]


@pytest.mark.parametrize(("pipeline", "steps"), [("model", MODEL), ("step", STEP)])
def test_architecture_lists_each_pipeline_in_its_order(pipeline, steps):
    """The table's row names every pass of the list once, in its order (each branch of a
    choice in turn): a misspelled name is no pass, so the row would lack that pass."""
    every = {cls.name for cls in defined_passes()}
    quoted = re.findall(r"`([a-z0-9_]+)`", _table_row(pipeline))
    assert [name for name in quoted if name in every] == PassManager(steps).names
