"""Training steps sharded across processes (FSDP): graphamp's step on a model
sharded with FSDP2's fully_shard, on 2 and 4 gloo ranks of this CPU, against FSDP2 +
MixedPrecisionPolicy(float16) + autocast + ShardedGradScaler on the same model, data and
split. The workers are in tests/training/sharded_workers.py (one spawn per world size: starting
processes is the cost).

Parameters are compared as the model's whole parameter vector (gathered from the shards),
||a - b|| / ||b||."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import graphamp
import graphamp.fx
from graphamp.core.graph import NodeKind, Role
from graphamp.core.vocab import Rule
from graphamp.passes import PassContext, PassManager
from graphamp.passes.options import Options
from graphamp.passes.pipeline import STEP
from graphamp.policy.policy import Policy
from graphamp.training.distributed import Sharding
from tests.helpers import doc_blocks, each_rank, torchrun
from tests.opgraphs import GraphBuilder
from tests.training import sharded_workers as workers

TWO = {
    "float32": {},  # the model's policy reduces in float32: the step takes it up
    "float16": {"reduce": "float16"},
    "overflow": {"poison": (5, 1)},  # an inf in rank 1's rows at step 5
    "adamw": {"optim": "adamw"},
    "idle": {"optim": "adamw", "idle": True},  # a layer no gradient reaches
    "clip": {"clip": 0.05},
    "mesh": {"mesh_argument": True, "reference": False},  # train_step shards the model
    "compiled": {"compile": True, "reference": False},  # step.compile(): under inductor
    "checkpoint": {},
    "bad inputs": {},
}
FOUR = {
    "float32": {},
    "float16": {"reduce": "float16"},
    "overflow": {"poison": (5, 3)},
}


def relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    flat_a = torch.cat([a[k].flatten() for k in sorted(b)])
    flat_b = torch.cat([b[k].flatten() for k in sorted(b)])
    return float((flat_a - flat_b).norm() / flat_b.norm())


def same_on_every_rank(ranks: list[dict], scenario: str) -> bool:
    first = ranks[0][scenario]
    return all(
        first["params"].keys() == r[scenario]["params"].keys()
        and all(torch.equal(first["params"][k], r[scenario]["params"][k]) for k in first["params"])
        and first["scales"] == r[scenario]["scales"]
        and first["skipped"] == r[scenario]["skipped"]
        for r in ranks[1:]
    )


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return workers.spawn(workers.worker, tmp_path_factory.mktemp("sharded2"), 2, TWO)


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return workers.spawn(workers.worker, tmp_path_factory.mktemp("sharded4"), 4, FOUR)


def ranks_of(request: pytest.FixtureRequest, world: int) -> list[dict]:
    return request.getfixturevalue({2: "two", 4: "four"}[world])


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_float32_reduction_matches_fsdp2_with_sharded_grad_scaler(request, world):
    ranks = ranks_of(request, world)
    ours, fsdp = ranks[0]["float32"], ranks[0]["float32 fsdp"]
    assert same_on_every_rank(ranks, "float32")
    difference = relative(ours["params"], fsdp["params"])
    print(f"{world} ranks, float32 reduce-scatter: {difference:.2e} from FSDP2's")
    assert difference <= 1e-5
    start = workers.net().state_dict()
    assert relative(start, fsdp["params"]) > 1e-2  # the comparison is between trained weights
    assert ours["scales"] == fsdp["scales"] and ours["skipped"] == fsdp["skipped"]
    # the collectives are decisions of the plan: the parameters gathered in float16 (only
    # float16 ops read them), the gradients reduce-scattered in the model's reduce_dtype
    gather = ours["collectives"]["all_gather.0"]
    assert gather[0] == "float16" and "only float16 ops read them" in gather[1]
    assert f"gathered whole from the {world} ranks' shards" in gather[1]
    scatter = ours["collectives"]["reduce_scatter.0"]
    assert scatter[0] == "float32" and "MixedPrecisionPolicy" in scatter[1]
    assert "each rank checks only its own shards" in ours["collectives"]["all_reduce.found_inf"][1]
    code = ours["code"]
    assert code.count("_c10d_functional.all_gather_into_tensor.default") == 1
    assert code.count("_c10d_functional.reduce_scatter_tensor.default") == 1


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_float16_reduction_drifts_little_from_fsdp2s(request, world):
    """A float16 reduce-scatter against FSDP2's (reduce_dtype=float16): both divide by about
    the square root of the world size before the sum and the rest after, but gloo adds the
    four ranks' float16 shares in an order that depends on the buffer's layout (FSDP2 sends
    one buffer per fully_shard group, graphamp one per bucket), and float16 sums round: the
    drift is reported here, not held to float32's bound. Two ranks' sums are one addition."""
    ranks = ranks_of(request, world)
    ours, fsdp = ranks[0]["float16"], ranks[0]["float16 fsdp"]
    assert same_on_every_rank(ranks, "float16")
    drift = relative(ours["params"], fsdp["params"])
    from_float32 = relative(ours["params"], ranks[0]["float32"]["params"])
    print(
        f"{world} ranks, float16 reduce-scatter: {drift:.2e} from FSDP2's float16 reduction, "
        f"{from_float32:.2e} from graphamp's float32 one"
    )
    assert drift <= 1e-3
    assert ours["collectives"]["reduce_scatter.0"][0] == "float16"
    assert 0 < from_float32 <= 1e-2  # it was float16, and it stays close


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_an_overflow_on_one_rank_skips_the_same_step_as_sharded_grad_scaler(request, world):
    ranks = ranks_of(request, world)
    ours, fsdp = ranks[0]["overflow"], ranks[0]["overflow fsdp"]
    assert same_on_every_rank(ranks, "overflow")
    assert 5 in ours["skipped"] and ours["skipped"] == fsdp["skipped"]
    assert ours["scales"] == fsdp["scales"]  # backed off at the same steps, by GradScaler's rules
    assert all(torch.isfinite(p).all() for p in ours["params"].values())
    assert relative(ours["params"], fsdp["params"]) <= 1e-5


@pytest.mark.dist
def test_adamw_and_clipping_match_fsdp2(two):
    for scenario in ("adamw", "clip"):
        ours, fsdp = two[0][scenario], two[0][f"{scenario} fsdp"]
        assert same_on_every_rank(two, scenario)
        difference = relative(ours["params"], fsdp["params"])
        print(f"2 ranks, {scenario}: {difference:.2e} from FSDP2's")
        assert difference <= 1e-5, scenario
    # clipping by the global norm was active: the clipped run differs from the unclipped one
    assert relative(two[0]["clip"]["params"], two[0]["float32"]["params"]) > 1e-3
    clip = two[0]["clip"]["collectives"]["clip_grad_norm"][1]
    assert "each rank's part of it summed over the 2 ranks" in clip


@pytest.mark.dist
def test_a_layer_no_gradient_reaches_is_left_as_adamw_under_fsdp2_leaves_it(two):
    ours, fsdp = two[0]["idle"], two[0]["idle fsdp"]
    assert same_on_every_rank(two, "idle")
    start = workers.net(idle=True).state_dict()
    for name in ("idle.weight", "idle.bias"):  # AdamW skips it: no weight decay
        assert torch.equal(ours["params"][name], start[name])
        assert torch.equal(fsdp["params"][name], start[name])
    assert relative(ours["params"], fsdp["params"]) <= 1e-5
    # the other layers train as in the net without the idle one
    assert relative(ours["params"], two[0]["adamw"]["params"]) <= 1e-6


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_each_rank_holds_a_shard_of_the_replicated_steps_state(request, world):
    """Parameters and optimizer state: the shards partition the replicated step's tensors
    (only the step count is on every rank), so each rank holds about 1/world of them."""
    ranks = ranks_of(request, world)
    model = workers.net()
    replicated = graphamp.fx.train_step(
        model,
        nn.functional.mse_loss,
        torch.optim.SGD(model.parameters(), lr=workers.LR, momentum=0.9),
        dtype="float16",
    )
    replicated(torch.randn(4, 5), torch.randn(4, 3))
    whole = replicated.state_bytes()
    held = [r["float32"]["state_bytes"] for r in ranks]
    step_count = 4  # the one scalar every rank keeps
    assert sum(held) == whole + (world - 1) * step_count
    assert max(held) <= 1.15 * whole / world  # the rows that do not divide go to the first ranks
    # FSDP2 holds the same shards, and sharded gradients between steps besides
    assert all(r["float32"]["state_bytes"] < r["float32 fsdp"]["state_bytes"] for r in ranks)


@pytest.mark.dist
def test_the_step_shards_an_unsharded_model_given_a_mesh(two):
    assert same_on_every_rank(two, "mesh")
    # no MixedPrecisionPolicy: float32 gradients, as the float32 run's; the same parameters
    assert all(
        torch.equal(two[0]["mesh"]["params"][k], v) for k, v in two[0]["float32"]["params"].items()
    )


@pytest.mark.compile
@pytest.mark.dist
def test_the_compiled_sharded_step_trains_as_the_eager_one(two):
    """step.compile() hands inductor the functional graph, collectives included: its fusions
    round differently, so the parameters are close, not equal."""
    compiled, eager = two[0]["compiled"], two[0]["float32"]
    assert same_on_every_rank(two, "compiled")
    assert relative(compiled["params"], eager["params"]) <= 1e-4
    assert compiled["scales"] == eager["scales"]


@pytest.mark.dist
def test_a_distributed_checkpoint_resumes_to_the_same_parameters(two):
    """10 steps, torch.distributed.checkpoint save, a new model and optimizer loaded from it,
    10 more: the parameters of 20 steps without a break, bit for bit."""
    resumed, straight = two[0]["checkpoint"], two[0]["float32"]
    assert same_on_every_rank(two, "checkpoint")
    assert all(torch.equal(resumed["params"][k], v) for k, v in straight["params"].items())
    assert resumed["scales"] == straight["scales"][workers.STEPS // 2 :]


@pytest.mark.dist
def test_bad_input_is_one_line_and_no_step(two):
    errors = two[0]["bad inputs"]
    assert (
        "process_group holds ranks [0, 1] but the model is sharded on a mesh of ranks [0]"
        in (errors["mesh"])
    )
    assert "the optimizer was built before fully_shard" in errors["optimizer"]
    assert (
        "grad_dtype='float16' but the model's FSDP2 MixedPrecisionPolicy reduces"
        in (errors["grad_dtype"])
    )
    assert all("\n" not in message for message in errors.values())


@pytest.mark.dist
def test_the_fsdp2_example_trains_a_sharded_llama_under_torchrun(tmp_path):
    """docs/distributed.md's FSDP2 script, as written, on two processes started by torchrun:
    every rank ends with the same whole parameters, holds half of the parameters and AdamW
    state, and the sharded checkpoint is written. A failure prints each rank's output."""
    script = doc_blocks("docs/distributed.md", "python", "torchrun")[1]
    (tmp_path / "train_fsdp.py").write_text(script)
    status, ranks, launcher = torchrun(tmp_path / "train_fsdp.py", timeout=600)
    assert status == 0, each_rank(ranks, launcher)
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    count = sum(p.numel() for p in transformers.LlamaForCausalLM(config).parameters())
    replicated = 3 * 4 * count  # float32 parameters and two AdamW moments
    checksums = set()
    for rank, (out, _) in enumerate(ranks):
        number = r"(-?\d+\.\d+(?:e[+-]?\d+)?)"
        found = re.findall(rf"rank {rank}: .*holds ([\d,]+) bytes .*parameters {number}", out)
        assert len(found) == 1, each_rank(ranks)
        held, checksum = found[0]
        assert abs(int(held.replace(",", "")) - replicated / 2) <= 0.02 * replicated
        checksums.add(checksum)
    assert len(checksums) == 1, each_rank(ranks)  # the same whole parameters on both ranks
    first = ranks[0][0]
    assert "all_gather.0: float16: " in first and "half of float32's" in first
    assert "reduce_scatter.0: float32: " in first
    assert len(list((tmp_path / "llama-sharded").glob("*.distcp"))) == 2


# ---- the passes on a step graph built in code --------------------------------------------


def sharded_step_graph():  # type: ignore[no-untyped-def]
    """A traced sharded step's shape: shards s1, s2 (the optimizer's), whole parameters w1, w2
    (the forward's: w1 read only through a cast to float16, w2 by a float32 op; the
    whole_parameters option pairs them with the shards), gradients g1, g2 of the whole
    parameters, each shard updated by its gradient."""
    b = GraphBuilder()
    s1, s2, w1, w2, x = (b.input(n, fixed=True) for n in ("s1", "s2", "w1", "w2", "x"))
    low = b.op("w1.low", "_to_copy", [w1], kind=NodeKind.CAST, cast_to="float16")
    h = b.op("h", "mm", [x, low])
    loss = b.op("loss", "layer_norm", [h, w2])
    seed = b.op("seed", "ones_like", [loss])
    g1 = b.op("g1", "mul", [seed, x])
    g2 = b.op("g2", "mul", [seed, w2])
    new1, new2 = b.op("new1", "sub", [s1, g1]), b.op("new2", "sub", [s2, g2])
    graph = b.output(loss, new1, new2)
    roles = {loss: Role.LOSS, seed: Role.GRAD_SEED, g1: Role.GRADIENT, g2: Role.GRADIENT}
    for name, role in {**roles, new1: Role.UPDATE, new2: Role.UPDATE}.items():
        graph.tensors[name].role = role
    graph.tensors[new1].replaces, graph.tensors[new2].replaces = s1, s2
    graph.tensors[w1].shape = graph.tensors[g1].shape = (5, 4)
    graph.tensors[w2].shape = graph.tensors[g2].shape = (3,)
    return graph


def test_the_sharded_passes_gather_reduce_scatter_and_agree():
    sharding = Sharding("7", world_size=2, rank=1, bucket_bytes=1 << 20)
    context = PassContext(
        sharded_step_graph(),
        Policy.create("float16"),
        Options(
            loss_scaling=graphamp.DynamicLossScaling(),
            shard=sharding,
            whole_parameters={"w1": ("s1", "layer.weight"), "w2": ("s2", "norm.weight")},
        ),
    )
    context = PassManager(STEP, check=True).run(context)
    graph, script, decisions = context.graph, context.script, context.decisions
    assert script.new_nodes[:3] == ["all_gather.0", "all_gather.1", "reduce_scatter.0"]
    assert "all_reduce.found_inf" in script.new_nodes  # always, for a sharded step
    # w1, read only through a cast to float16: gathered in float16, and the cast gone
    first, second = graph.nodes["all_gather.0"], graph.nodes["all_gather.1"]
    assert first.inputs == ["s1"] and first.params["dtype"] == "float16"
    assert first.params["rows"] == "5"
    assert script.remove_nodes == ["w1.low"]  # the dialect drops the cast
    assert not any("w1.low" in graph.nodes[n].inputs for n in graph.nodes)
    assert graph.nodes["h"].inputs[1] == "w1.gathered"
    assert decisions["all_gather.0"].precision == "float16"
    assert decisions["all_gather.0"].rule == Rule.ALL_GATHER
    assert "(layer.weight) gathered whole from the 2 ranks' shards" in (
        decisions["all_gather.0"].reason
    )
    assert "received as float16 (half of float32's): only float16 ops read them" in (
        decisions["all_gather.0"].reason
    )
    # w2, read by a float32 op: gathered as stored
    assert second.inputs == ["s2"] and second.params["dtype"] == "float32"
    assert "loss reads norm.weight in float32" in decisions["all_gather.1"].reason
    assert graph.nodes["loss"].inputs[1] == "w2.gathered"
    # the whole parameters are no graph inputs any more
    assert script.removed_inputs == ["w1", "w2"]
    assert not {"w1", "w2"} & set(graph.graph_inputs)
    # the gradients are reduce-scattered (scaled), unscaled; the updates read the shards
    scatter = graph.nodes["reduce_scatter.0"]
    assert scatter.params["rank"] == 1 and scatter.params["dtype"] == "float32"
    assert decisions["reduce_scatter.0"].rule == Rule.REDUCE_SCATTER
    assert sorted(graph.nodes["unscale"].inputs[1:]) == ["g1.shard", "g2.shard"]
    assert graph.nodes["new1"].inputs[1] == "g1.shard.unscaled"
    for reader in ("step_guard", "skip_count", "scale_update"):
        assert "found_inf.agreed" in graph.nodes[reader].inputs, reader
