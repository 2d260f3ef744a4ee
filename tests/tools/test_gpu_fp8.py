"""tools/gpu/gpu_fp8.py, the float8 GPU benchmark, kept working on a machine without a GPU:
its dry run, every configuration at tiny sizes on the CPU (not speed figures: none is
asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_fp8():
    spec = importlib.util.spec_from_file_location("gpu_fp8", ROOT / "tools/gpu/gpu_fp8.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_dry_run_measures_every_configuration(gpu_fp8, tmp_path, capsys):
    out = tmp_path / "fp8.json"
    assert gpu_fp8.main(["--dry-run", "--runs", "1", "--warmup", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "dry run" in printed and "## One LLaMA-3-8B decoder block" in printed
    results = json.loads(out.read_text())
    assert [row["gemm"] for row in results["gemms"]] == ["64^3", "tiny up", "tiny down"]
    for row in results["gemms"]:
        assert all(row[f"{case} TFLOP/s"] > 0 for case in ("bfloat16", "float8 per tensor"))
    layers = {row["configuration"]: row["float8 layers"] for row in results["block"]}
    assert layers == {
        "graphamp bfloat16": 0,
        "graphamp float8 current tensorwise": 7,  # every projection of the block
        "graphamp float8 current rowwise": 7,
        "graphamp float8 delayed": 7,
        "autocast bfloat16": 0,
        "torchao Float8Linear tensorwise": 7,  # the same layers
        "torchao Float8Linear rowwise": 7,
    }
    assert all(row["seconds"] > 0 and row["compiled"] == "no" for row in results["block"])


def test_without_a_gpu_it_says_so(gpu_fp8, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert gpu_fp8.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err
