"""Float8 steps across two gloo ranks (issue 41): data-parallel over a process group and
sharded with FSDP2, each rank on half of every global batch (SGD with momentum, whose updates
follow the gradients' size), against one process on the whole batch
(tests/training/float8_workers.py). Current scaling quantises each rank's activations
with their own amax (torchao's default): the ranks agree, and differ from one process by
float8 rounding only. Delayed scaling reduces the amaxes with MAX first, so every rank keeps
the same history and scales: the whole batch's, where the values are the same (the input)."""

from __future__ import annotations

import pytest
import torch

from tests.training import dist_workers, float8_workers

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return dist_workers.spawn(float8_workers.worker, tmp_path_factory.mktemp("float8"))


@pytest.fixture(scope="module")
def single() -> dict[str, dict]:
    torch.set_num_threads(1)
    recipes = ("current", "delayed", "bfloat16")
    return {recipe: float8_workers.train(recipe, None, None) for recipe in recipes}


def relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    flat_a = torch.cat([a[k].flatten() for k in sorted(b)])
    flat_b = torch.cat([b[k].flatten() for k in sorted(b)])
    return float((flat_a - flat_b).norm() / flat_b.norm())


@pytest.mark.parametrize("name", list(float8_workers.SCENARIOS))
def test_ranks_agree_and_train_as_one_process(ranks, single, name):
    first, second = ranks[0][name], ranks[1][name]
    recipe = float8_workers.SCENARIOS[name][0]
    alone = single[recipe]
    assert first["skipped"] == second["skipped"] == alone["skipped"] == 0
    assert first["gemms"] == alone["gemms"] and len(alone["gemms"]) == 5  # 2 + 2 + 1
    # a sharded step gathers the weights in bfloat16 and quantises the whole bfloat16 copy
    assert first["gathered"] == (["bfloat16"] if name.startswith("fsdp") else [])
    for key in first["params"]:
        assert torch.equal(first["params"][key], second["params"][key]), key
    start = {n: p.detach() for n, p in float8_workers.net().named_parameters()}
    assert relative(start, alone["params"]) > 1e-2  # trained, not compared at the start
    # Splitting the batch (each half its own amaxes, partial sums rounded apart) moves the
    # float8 result by float8's own size: at most twice what float8 moves it from bfloat16.
    split = relative(first["params"], alone["params"])
    float8 = relative(alone["params"], single["bfloat16"]["params"])
    assert split <= 2 * float8, (split, float8)


@pytest.mark.parametrize("name", ["ddp delayed", "fsdp delayed"])
def test_delayed_scaling_reduces_the_amaxes_over_the_ranks(ranks, single, name):
    first, second, alone = ranks[0][name], ranks[1][name], single["delayed"]
    assert first["state"].keys() == alone["state"].keys()
    for key, value in first["state"].items():
        assert torch.equal(value, second["state"][key]), key
    # the first layer's input is the data: the largest over both halves is the whole batch's
    history = "float8.0/linear.input.amax_history"
    assert torch.equal(first["state"][history], alone["state"][history])
    assert "reduced with MAX over the 2 ranks" in first["update"]["float8.scale_update"]
