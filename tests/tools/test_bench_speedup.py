"""tools/bench/bench_speedup.py, issue 42's CPU benchmark, kept working: every part at tiny sizes
without torch.compile (its timings are not asserted: tests never time anything), and the bars
computed from timings given here."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import load_tool


@pytest.fixture(scope="module")
def bench():
    return load_tool("tools/bench/bench_speedup.py")


def rows(text: str) -> list[list[str]]:
    """The body rows of every Markdown table in ``text``."""
    found = []
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            found.append([cell.strip() for cell in line.strip("|").split("|")])
    return [row for row in found if row[0] not in ("model",)]


def quick(bench, tmp_path, *args: str) -> str:
    common = ["--quick", "--no-compile", "--threads", "1", "--models", "resnet50"]
    assert bench.main([*common, *args, "--out", str(tmp_path)]) == 0
    part = args[args.index("--part") + 1]
    return (tmp_path / f"bench-speedup-{part}-resnet50.md").read_text()


def test_bars_are_medians_of_ratios_within_rounds(bench):
    """Round by round the machine's load moves every configuration alike: each bar is the
    median of the per-round ratios, and it says which bars are met."""
    rounds = {
        "float32-compiled": [3.0, 6.0, 3.0],  # the second round ran on a loaded machine
        "graphamp": [1.2, 2.4, 1.2],
        "graphamp-compiled": [1.0, 2.0, 1.0],
        "autocast": [1.1, 2.2, 1.1],
        "compile+autocast": [1.1, 2.0, 1.4],
    }
    bars = {
        row.split(" | ")[0]: row.split(" | ")[1:] for row in bench.train_bars("bert-base", rounds)
    }
    best = "graphamp's best step (graphamp train_step bfloat16, compiled) vs float32 compiled"
    assert bars[best] == ["3.00x", "2.50x", "met"]
    assert bars["graphamp compiled vs graphamp eager"] == ["1.20x", "1.00x", "met"]
    assert bars["graphamp compiled vs compile + autocast"] == ["1.10x", "1.00x", "met"]
    assert bars["graphamp eager vs eager autocast"] == ["0.92x", "1.00x", "NOT met"]
    assert not any(name.startswith("graphamp backend") for name in bars)  # not run


@pytest.mark.slow
def test_training_configurations_side_by_side(bench, tmp_path):
    text = quick(bench, tmp_path, "--part", "train")
    assert "avx" in text or "flags" in text  # the machine is named
    assert "torch " + torch.__version__ in text
    table = rows(text)
    labels = [row[2] for row in table if row[0] == "resnet50" and len(row) == 9]
    assert labels == ["float32", "eager autocast bfloat16", "graphamp train_step bfloat16"]
    bars = [row for row in table if len(row) == 5]
    assert [row[1] for row in bars] == ["graphamp eager vs eager autocast"]
    assert bars[0][4] in ("met", "NOT met") and bars[0][2].endswith("x")
    results = json.loads((tmp_path / "bench-speedup-train-resnet50.json").read_text())["results"]
    assert all(len(times) == 1 for times in results["resnet50"]["wall"].values())


@pytest.mark.slow
def test_memory_counts_the_state_and_what_the_step_allocates(bench, tmp_path):
    text = quick(bench, tmp_path, "--part", "memory", "--configs", "float32", "graphamp")
    table = {row[2]: row for row in rows(text) if len(row) == 7}
    results = json.loads((tmp_path / "bench-speedup-memory-resnet50.json").read_text())["results"]
    measured = results["resnet50"]
    from graphamp.models.resnet import SIZES, ResNet

    shape = SIZES["small"]
    params = sum(p.numel() * 4 for p in ResNet(shape["blocks"], shape["width"], 10).parameters())
    # Both hold the parameters and their momentum; graphamp trains the model's own tensors,
    # so no second copy of the parameters
    assert measured["float32"]["state"] >= 2 * params
    assert 2 * params <= measured["graphamp"]["state"] < 3 * params
    assert all(figures["step"] > 0 for figures in measured.values())
    assert table["float32"][5] == "1.00x"
    assert any("peak of one step" in row[1] for row in rows(text) if len(row) == 5)


def test_live_tensor_bytes_counts_each_storage_once(bench):
    before = bench.live_tensor_bytes()
    block = torch.empty(250_000)  # 1 MB
    views = [block[10:], block.view(500, 500)]  # the same storage
    after = bench.live_tensor_bytes()
    assert 1_000_000 <= after - before < 1_100_000, (after - before, len(views))


@pytest.mark.slow
def test_curves_report_progress_non_finite_losses_and_skipped_steps(bench, tmp_path, capsys):
    """A curve of a real model takes minutes: each says how far it is as it goes. The table
    counts NaN losses and the steps graphamp's guard skipped beside the windows."""
    text = quick(bench, tmp_path, "--part", "curves")
    err = capsys.readouterr().err
    for key in ("autocast", "graphamp"):
        for seed in (0, 1):
            assert f"curves: resnet50 {key} seed {seed}: 10/10 steps," in err
    assert "curves: resnet50 graphamp seed 1: 1/10 steps," in err  # as it goes, not at the end
    (row,) = [row for row in rows(text) if row[0] == "resnet50"]
    assert row[4].endswith("/1") and row[8] == "0 / 0" and row[9] == "0"
    assert row[5] == "-"  # two seeds: no held-out band (a band of one run is a line)
    results = json.loads((tmp_path / "bench-speedup-curves-resnet50.json").read_text())["results"]
    curves = results["resnet50"]
    assert [len(c) for c in curves["graphamp"]] == [10, 10] and curves["skipped"] == [0, 0]
    assert curves["non_finite"] == {"autocast": 0, "graphamp": 0}


def test_each_model_run_apart_keeps_its_own_results(bench):
    """--models resnet50, then --models bert-base, into one --out: neither overwrites the
    other's files; every model at once keeps the part's plain name."""
    names = {bench.output_stem("curves", [m]) for m in bench.MODELS}
    assert len(names) == len(bench.MODELS)
    assert bench.output_stem("curves", list(bench.MODELS)) == "bench-speedup-curves"
    assert bench.output_stem("curves", ["resnet50"]) == "bench-speedup-curves-resnet50"


def test_the_environment_names_free_memory_and_the_page_cache(bench, tmp_path):
    """The kernel reclaims page cache inside a step's page faults where free memory runs
    out, which slowed eager steps 1.3-1.6x: every run says what it had."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 24000000 kB\nMemFree: 2097152 kB\nCached: 8388608 kB\n")
    assert bench.memory(meminfo) == "free 2.0 GiB, page cache 8.0 GiB"
    meminfo.write_text("nothing here\n")
    assert bench.memory(meminfo) == "memory not read"
    assert "page cache" in bench.environment() or "memory not read" in bench.environment()
