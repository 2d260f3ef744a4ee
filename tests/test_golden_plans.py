"""The plans of every zoo model, in both dtypes and both dialects, are byte-identical to the
plans recorded in ``tests/golden/``.

They are the record of what the engine decides: a refactor must not move a single decision,
cast or reason. A change that means to move decisions regenerates them on purpose and the diff
is reviewed like code::

    GRAPHAMP_UPDATE_GOLDEN=1 python -m pytest tests/test_golden_plans.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import onnx
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


# Float8 plans (issue 41) of the zoo's transformers, calibrated on fixed data: every float8
# decision, its rule and reason, and every scale record's source, granularity and settings.
FP8_NAMES = ("bert", "gpt")
_AMAX = re.compile(r'"amax": (-?[0-9.e+-]+)')


def _calibration(path: Path) -> list[dict[str, np.ndarray]]:
    """Four batches of token ids (and token types), as docs/float8.md calibrates."""
    rng = np.random.default_rng(0)
    names = [value.name for value in onnx.load(str(path), load_external_data=False).graph.input]
    batches = []
    for _ in range(4):
        feeds = {"input_ids": rng.integers(0, 128, (2, 16)).astype(np.int64)}
        if "token_type_ids" in names:
            feeds["token_type_ids"] = rng.integers(0, 2, (2, 16)).astype(np.int64)
        batches.append(feeds)
    return batches


def _compare_measured(path: Path, text: str) -> None:
    """As :func:`_compare`, but the calibrated ``amax`` of each scale record to 1e-6 relative:
    they are onnxruntime's float32 results, whose last bits may move with the CPU's kernels;
    everything else byte for byte."""
    if UPDATE or not path.exists():
        _compare(path, text)
        return
    recorded = path.read_text(encoding="utf-8")
    assert _AMAX.sub('"amax": _', text) == _AMAX.sub('"amax": _', recorded), (
        f"{path.name}: the plan changed"
    )
    found = [float(v) for v in _AMAX.findall(text)]
    expected = [float(v) for v in _AMAX.findall(recorded)]
    assert np.allclose(found, expected, rtol=1e-6, atol=0), f"{path.name}: a calibrated amax moved"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", FP8_NAMES)
def test_onnx_float8_plan_unchanged(zoo_model, name, dtype):
    import graphamp
    import graphamp.onnx as gonnx

    path = zoo_model(name)
    ranges = gonnx.calibrate(str(path), _calibration(path), histograms=True)
    plan = gonnx.convert(path, dtype=dtype, fp8=graphamp.Float8.static(), ranges=ranges).plan
    assert plan.fp8 and plan.scales  # a float8 plan (version 2), not the plain one
    _compare_measured(GOLDEN / f"onnx_{name}_{dtype}_fp8.plan.json", plan.to_json())
