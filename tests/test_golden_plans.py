"""The plans of every zoo model, in both dtypes and both dialects, are byte-identical to the
plans recorded in ``tests/golden/``.

They are the record of what the engine decides: a refactor must not move a single decision,
cast or reason. A change that means to move decisions regenerates them on purpose and the diff
is reviewed like code::

    GRAPHAMP_UPDATE_GOLDEN=1 python -m pytest tests/test_golden_plans.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import ZOO_NAMES

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("GRAPHAMP_UPDATE_GOLDEN") == "1"
DTYPES = ("float16", "bfloat16")


def _compare(path: Path, text: str) -> None:
    if UPDATE:
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"{path.name}: no recorded plan (GRAPHAMP_UPDATE_GOLDEN=1 records it)"
    assert text == path.read_text(encoding="utf-8"), f"{path.name}: the plan changed"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_onnx_plan_unchanged(zoo_model, name, dtype):
    import graphamp.onnx as gonnx

    plan = gonnx.convert(zoo_model(name), dtype=dtype).plan
    _compare(GOLDEN / f"onnx_{name}_{dtype}.plan.json", plan.to_json())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_fx_plan_unchanged(name, dtype):
    import graphamp.fx as gfx
    from graphamp.models import build

    model, inputs = build(name, "small")
    _, plan = gfx.convert(model, inputs, device="cpu", dtype=dtype)
    _compare(GOLDEN / f"fx_{name}_{dtype}.plan.json", plan.to_json())
