"""tools/bench/bench_fp8_onnx.py --tune, issue 41's tuned float8 figures, kept working: the
calibration, tune and held-out data are three different sets, and the tuned model is measured
as the plain one (error on the held-out batches, float8 products, weight bytes); ``--variants``
measures ``--fp8-embeddings`` beside it. The figures on the zoo's full models are the
benchmark's, not a test's."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    path = ROOT / "tools/bench/bench_fp8_onnx.py"
    spec = importlib.util.spec_from_file_location("bench_fp8_onnx", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tune_figures_on_data_of_its_own(bench, tmp_path):
    args = argparse.Namespace(
        size="small", calibration=2, held_out=[2], seeds=1, tune=True, tune_batches=2,
        tune_scale=1.0, variants=["default", "embeddings"],
    )  # fmt: skip
    found, tabled = bench.measure("gpt", "small", args, tmp_path)
    assert (found["variant"], tabled["variant"]) == ("default", "embeddings")
    reference = onnx.load(str(tmp_path / "gpt.onnx"))
    calibration, held_out, tune = (bench.batches(reference, 2, seed) for seed in (0, 1, 2))
    for a, b in ((calibration, tune), (held_out, tune), (calibration, held_out)):
        assert not np.array_equal(a[0]["input_ids"], b[0]["input_ids"])
    tuned = found["tune"]
    assert tuned["rtol"] == bench.BARS["gpt"] and tuned["met_on_tune_data"]
    assert set(tuned["error"]) == {"2"}
    # keeping products in the low type costs weight bytes, never saves them
    assert tuned["fp8_products"] == len(found["fp8_nodes"]) - len(tuned["kept"])
    assert tuned["weight_ratio"] >= found["weight_ratio"]
    # the 8-bit word and position tables: half their float16 bytes and a scale per row, the
    # rest as it was
    assert found["tables_8bit"] == []
    assert sorted(tabled["tables_8bit"]) == ["/Add", "/word/Gather"]
    width, tables = 32, {"word": 128, "position": 16}  # the small GPT's tables' rows
    rows = sum(tables.values())
    assert found["weight_bytes_by_role"]["embedding"] == rows * width * 2
    assert tabled["weight_bytes_by_role"]["embedding"] == rows * width + rows * 2
    assert tabled["weight_bytes"] == found["weight_bytes"] - rows * width + rows * 2
    assert tabled["fp8_nodes"] == found["fp8_nodes"]
    assert tabled["tune"]["met_on_tune_data"]  # tune --fp8 --fp8-embeddings meets the bar
