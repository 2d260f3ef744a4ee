"""tools/bench/bench_fp8_train.py, issue 41's loss curves, kept working: its data is the Markov
chain it says, a float8 recipe trains the zoo's GPT a few steps with every linear layer in
float8, and the bar (worst 20-step mean gap past step 20) is computed from losses given here.
The 500-step figures themselves are the benchmark's, not a test's."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

import graphamp

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    path = ROOT / "tools/bench/bench_fp8_train.py"
    spec = importlib.util.spec_from_file_location("bench_fp8_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_batches_are_next_tokens_of_a_chain_with_four_successors(bench):
    data = bench.batches(8)
    successors: dict[int, set[int]] = {}
    for inputs, targets in data:
        assert inputs.shape == targets.shape == (bench.BATCH, bench.SEQ)
        assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the next tokens
        for a, b in zip(inputs.flatten().tolist(), targets.flatten().tolist(), strict=True):
            successors.setdefault(a, set()).add(b)
    assert max(len(s) for s in successors.values()) <= 4
    assert torch.equal(bench.batches(2)[1][0], data[1][0])  # the same seed, the same data


def test_the_worst_gap_is_past_the_first_window_and_relative(bench):
    reference = [4.0] * 20 + [2.0] * 20 + [1.0] * 20
    ours = [9.0] * 20 + [2.1] * 20 + [1.0] * 20  # the first window does not count
    gap, first = bench.worst_gap(ours, reference)
    assert gap == pytest.approx(0.05) and first == 20
    assert bench.worst_gap(ours[:30], reference[:30]) == (0.0, 0)  # no window past step 20


@pytest.mark.slow
def test_a_float8_recipe_trains_every_linear_layer_in_float8(bench):
    torch.set_num_threads(1)
    data = bench.batches(3)
    run = bench.train(graphamp.Float8.current(sizes="none"), data)
    assert run["float8_layers"] == 12  # the LM head and the attention products kept
    assert run["skipped"] == 0 and run["nan"] == 0
    losses = run["losses"]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]  # it learns
