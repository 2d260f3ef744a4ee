"""Training steps across processes: two gloo ranks on this CPU, each on half of a
global batch, against one process on the whole batch. The workers are in
tests/training/dist_workers.py.

Parameters are compared as the model's parameter vector, ||a - b|| / ||b||: float16 backward
rounds a half batch's partial sums differently from the whole batch's, so a small tensor (a
4-element bias) on its own differs by float16's rounding (2e-4) whatever the reduction does."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import graphamp
import graphamp.fx
from graphamp.core.graph import Role
from graphamp.core.vocab import Rule
from graphamp.errors import GraphampError
from graphamp.passes import PassContext, PassManager
from graphamp.passes.options import Options
from graphamp.passes.pipeline import STEP
from graphamp.policy.policy import Policy
from graphamp.training.distributed import GradientClipping, GradientReduce, buckets
from tests.helpers import doc_blocks, each_rank, torchrun
from tests.opgraphs import GraphBuilder
from tests.training import dist_workers as workers

SCENARIOS = {
    # several buckets: as DDP's, a bucket closes once it reaches 100 bytes, the gradient that
    # reaches them in it: [4 bias, 4 x 32 weight] (528 bytes), [32 bias], [32 x 16 weight]
    "float32": {"bucket_bytes": 100},
    "float16": {"grad_dtype": "float16"},
    "bfloat16": {"grad_dtype": "bfloat16"},
    "poison": {"grad_dtype": "float16", "poison": (2, 1)},  # an inf in rank 1's half, step 2
    # the same with the flag itself all-reduced with MAX
    "poison agreed": {"grad_dtype": "float16", "poison": (2, 1), "agree": True},
    "accumulate": {"accumulate": 2},
    "clip": {"clip": 0.05, "grad_dtype": "float16"},
    "partial": {"last": 6},  # the last global batch of 6: 3 rows a rank, a second capture
}


def relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    flat_a = torch.cat([a[k].flatten() for k in sorted(b)])
    flat_b = torch.cat([b[k].flatten() for k in sorted(b)])
    return float((flat_a - flat_b).norm() / flat_b.norm())


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Every scenario trained once on two ranks (one spawn: starting processes is the cost)."""
    return workers.spawn(workers.train_worker, tmp_path_factory.mktemp("dist"), SCENARIOS)


@pytest.fixture(scope="module")
def single() -> dict[str, dict]:
    return {name: workers.train(settings, None) for name, settings in SCENARIOS.items()}


@pytest.mark.dist
def test_float32_reduction_equals_one_process_on_the_global_batch(ranks, single):
    first, second = ranks[0]["float32"], ranks[1]["float32"]
    assert bitwise_equal(first["params"], second["params"])
    assert bitwise_equal(first["opt_state"], second["opt_state"])
    assert relative(first["params"], single["float32"]["params"]) <= 1e-4
    moved = relative(workers.net().state_dict(), single["float32"]["params"])
    assert moved > 1e-2  # the comparison above is not between untrained weights
    assert first["skipped"] == single["float32"]["skipped"] == 0
    # three buckets: the reduce nodes are in the plan, in float32, with their bytes
    buckets = {k: v for k, v in first["reduce_nodes"].items() if k != "all_reduce.found_inf"}
    assert sorted(buckets) == ["all_reduce.0", "all_reduce.1", "all_reduce.2"]
    assert {precision for precision, _ in buckets.values()} == {"float32"}
    assert "528 bytes sent as float32" in buckets["all_reduce.0"][1]
    assert first["graphs"]["update"].count("_c10d_functional.all_reduce") == 3


@pytest.mark.dist
def test_float16_reduction_is_bitwise_equal_across_ranks_and_close(ranks, single):
    first, second = ranks[0]["float16"], ranks[1]["float16"]
    assert bitwise_equal(first["params"], second["params"])
    assert bitwise_equal(first["opt_state"], second["opt_state"])
    assert relative(first["params"], single["float32"]["params"]) <= 2e-2
    assert not bitwise_equal(first["params"], ranks[0]["float32"]["params"])  # it was float16
    ((precision, reason),) = [v for k, v in first["reduce_nodes"].items() if k == "all_reduce.0"]
    assert precision == "float16" and "half of float32's" in reason
    assert "small values survive float16" in reason  # the scaled gradients travel
    assert "skips the step on every rank" in reason  # how the ranks agree on found_inf
    assert "all_reduce.found_inf" not in first["reduce_nodes"]


@pytest.mark.dist
def test_bfloat16_reduction_is_bitwise_equal_across_ranks_and_close(ranks, single):
    first, second = ranks[0]["bfloat16"], ranks[1]["bfloat16"]
    assert bitwise_equal(first["params"], second["params"])
    assert relative(first["params"], single["float32"]["params"]) <= 2e-2
    assert first["reduce_nodes"]["all_reduce.0"][0] == "bfloat16"


@pytest.mark.dist
@pytest.mark.parametrize("scenario", ["poison", "poison agreed"])
def test_an_inf_on_one_rank_skips_the_step_on_both(ranks, single, scenario):
    first, second = ranks[0][scenario], ranks[1][scenario]
    assert first["skipped"] == second["skipped"] == 1
    assert first["scale"] == second["scale"] == pytest.approx(2.0**15 * 0.8)  # both moved
    assert bitwise_equal(first["params"], second["params"])
    assert all(torch.isfinite(p).all() for p in first["params"].values())
    # the skipped step changed nothing: as one process skipping the same step
    assert single[scenario]["skipped"] == 1
    assert relative(first["params"], single[scenario]["params"]) <= 2e-2
    # the flag travels on its own only when asked: the average carries the inf otherwise
    agreed = first["reduce_nodes"].get("all_reduce.found_inf")
    assert (agreed is not None) == (scenario == "poison agreed")
    if agreed is not None:
        assert "found_inf is the largest over the ranks" in agreed[1]
    assert first["graphs"]["update"].count("_c10d_functional.all_reduce") == 1 + (
        agreed is not None
    )


@pytest.mark.dist
def test_the_ranks_agree_on_found_inf_with_max(ranks):
    """Only rank 1 raised its flag; the MAX all-reduce node gives both ranks true."""
    assert ranks[0]["agreed"] is True and ranks[1]["agreed"] is True


@pytest.mark.dist
def test_accumulation_reduces_once_per_effective_batch(ranks, single):
    first, second = ranks[0]["accumulate"], ranks[1]["accumulate"]
    assert "_c10d_functional" not in first["graphs"]["accumulate"]
    assert first["graphs"]["update"].count("_c10d_functional.all_reduce") == 1
    assert bitwise_equal(first["params"], second["params"])
    assert relative(first["params"], single["accumulate"]["params"]) <= 1e-4


@pytest.mark.dist
def test_a_smaller_last_batch_is_captured_again_on_both_ranks(ranks, single):
    first, second = ranks[0]["partial"], ranks[1]["partial"]
    assert bitwise_equal(first["params"], second["params"])
    assert bitwise_equal(first["opt_state"], second["opt_state"])
    assert relative(first["params"], single["partial"]["params"]) <= 1e-4
    assert not bitwise_equal(first["params"], ranks[0]["float32"]["params"])  # it took the 6
    assert "_c10d_functional.all_reduce" in first["graphs"]["update"]  # the 3-row graph


@pytest.mark.dist
def test_clipping_by_the_global_norm_matches_one_process(ranks, single):
    first, second = ranks[0]["clip"], ranks[1]["clip"]
    assert bitwise_equal(first["params"], second["params"])
    assert relative(first["params"], single["clip"]["params"]) <= 2e-2
    # clipping was active: the clipped run moved less far than the unclipped one
    start = workers.net().state_dict()
    assert relative(single["clip"]["params"], start) < relative(single["float32"]["params"], start)


@pytest.mark.dist
def test_converted_module_trains_under_ddp_with_fp16_compress_hook(tmp_path):
    ranks = workers.spawn(workers.ddp_worker, tmp_path)
    assert bitwise_equal(ranks[0]["params"], ranks[1]["params"])
    alone = workers.ddp_train(None)
    assert relative(ranks[0]["params"], alone) <= 2e-2
    assert relative(workers.net().state_dict(), alone) > 1e-2


# ---- the passes on a step graph built in code, and clipping in one process ----------------


def two_gradient_step():  # type: ignore[no-untyped-def]
    """loss = f(w1, w2, x) * seed; g1, g2 from the seed; each w updated by its gradient."""
    b = GraphBuilder()
    w1, w2, x = (b.input(n, fixed=True) for n in ("w1", "w2", "x"))
    loss = b.op("loss", "MatMul", [w1, x])
    seed = b.op("seed", "ones_like", [loss])
    b.op("scaled", "mul", [loss, seed])
    g1 = b.op("g1", "mul", [seed, x])
    g2 = b.op("g2", "mul", [seed, w2])
    new1, new2 = b.op("new1", "sub", [w1, g1]), b.op("new2", "sub", [w2, g2])
    graph = b.output(loss, new1, new2)
    roles = {loss: Role.LOSS, seed: Role.GRAD_SEED, g1: Role.GRADIENT, g2: Role.GRADIENT}
    for name, role in {**roles, new1: Role.UPDATE, new2: Role.UPDATE}.items():
        graph.tensors[name].role = role
    graph.tensors[g1].shape = graph.tensors[g2].shape = (4, 4)  # 16 values: 32 bytes in float16
    graph.tensors[new1].replaces, graph.tensors[new2].replaces = w1, w2
    return graph


def run_step_passes(**options):  # type: ignore[no-untyped-def]
    context = PassContext(two_gradient_step(), Policy.create("float16"), Options(**options))
    return PassManager(STEP, check=True).run(context)


def test_reduce_nodes_sit_between_backward_and_unscaling_in_the_plan():
    reduce = GradientReduce(
        "7", world_size=2, dtype="float16", bucket_bytes=30, agree_found_inf=True
    )
    context = run_step_passes(
        loss_scaling=graphamp.DynamicLossScaling(),
        all_reduce=reduce,
        clip_grad_norm=GradientClipping(1.0),
    )
    graph, script, decisions = context.graph, context.script, context.decisions
    assert script.new_nodes == [
        "all_reduce.0",
        "all_reduce.1",
        "loss_scale",
        "unscale",
        "clip_grad_norm",
        "finite_check",
        "all_reduce.found_inf",
        "step_guard",
        "skip_count",
        "scale_update",
    ]
    # a float16 gradient of 32 bytes reaches 30 bytes alone: one bucket each
    assert graph.nodes["all_reduce.0"].inputs == ["g1"]
    assert graph.nodes["all_reduce.1"].inputs == ["g2"]
    # the scaled gradients are reduced, then unscaled, clipped and checked
    assert graph.nodes["unscale"].inputs[1:] == ["g1.reduced", "g2.reduced"]
    assert graph.nodes["clip_grad_norm"].inputs == ["g1.reduced.unscaled", "g2.reduced.unscaled"]
    clipped = ["g1.reduced.unscaled.clipped", "g2.reduced.unscaled.clipped"]
    assert graph.nodes["finite_check"].inputs == clipped
    assert [graph.nodes[n].inputs[1] for n in ("new1", "new2")] == clipped
    # every rank acts on the agreed flag
    for reader in ("step_guard", "skip_count", "scale_update"):
        assert "found_inf.agreed" in graph.nodes[reader].inputs, reader
        assert "found_inf" not in graph.nodes[reader].inputs, reader
    assert decisions["all_reduce.0"].precision == "float16"
    assert decisions["all_reduce.0"].rule == Rule.ALL_REDUCE
    assert "32 bytes sent as float16" in decisions["all_reduce.0"].reason
    assert decisions["clip_grad_norm"].rule == Rule.CLIP_GRAD_NORM
    assert graph.nodes["all_reduce.found_inf"].params["op"] == "max"


def test_without_a_process_group_no_reduce_node_is_added():
    context = run_step_passes(loss_scaling=None, all_reduce=None, clip_grad_norm=None)
    assert not any(name.startswith("all_reduce") for name in context.graph.nodes)


def test_bad_distributed_options_are_refused_in_one_line():
    model = workers.net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cases = [
        ({"grad_dtype": "float16"}, "need a process_group"),
        ({"process_group": "world"}, "not initialized"),
        ({"clip_grad_norm": -1.0}, "positive"),
    ]
    for options, message in cases:
        with pytest.raises(GraphampError, match=message):
            graphamp.fx.train_step(model, nn.functional.mse_loss, opt, **options)
    with pytest.raises(GraphampError, match="grad_dtype"):
        GradientReduce("0", 2, dtype="float64")


def test_clipping_follows_grad_scaler_unscale_then_clip_grad_norm():
    """In one process: the step's clipping against autocast + GradScaler.unscale_ +
    clip_grad_norm_, the way users write it."""
    model, reference = workers.net(), workers.net()
    step = graphamp.fx.train_step(
        model,
        nn.functional.mse_loss,
        torch.optim.SGD(model.parameters(), lr=workers.LR, momentum=0.9),
        dtype="float16",
        loss_scaling=graphamp.DynamicLossScaling.torch_defaults(),
        clip_grad_norm=0.05,
    )
    optimizer = torch.optim.SGD(reference.parameters(), lr=workers.LR, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    clipped_norms = []
    for x, y in workers.batches():
        step(x, y)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(reference(x).float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        clipped_norms.append(float(nn.utils.clip_grad_norm_(reference.parameters(), 0.05)))
        scaler.step(optimizer)
        scaler.update()
    assert min(clipped_norms) > 0.05  # every step was clipped
    expected = {k: v.detach() for k, v in reference.named_parameters()}
    assert relative(step.params, expected) <= 5e-3
    unclipped = workers.train({}, None)["params"]
    assert relative(unclipped, expected) > 10 * relative(step.params, expected)


@pytest.mark.dist
def test_the_data_parallel_example_runs_under_torchrun(tmp_path):
    """docs/distributed.md's data-parallel script, as written, on two processes started by
    torchrun: every rank ends with the same parameters. A failure prints each rank's output."""
    script = doc_blocks("docs/distributed.md", "python", "torchrun")[0]
    (tmp_path / "train_dp.py").write_text(script)
    status, ranks, launcher = torchrun(tmp_path / "train_dp.py")
    assert status == 0, each_rank(ranks, launcher)
    checksums = set()
    for rank, (out, _) in enumerate(ranks):
        found = re.findall(rf"rank {rank}: .*parameters (-?\d+\.\d+(?:e[+-]?\d+)?)", out)
        assert len(found) == 1, each_rank(ranks)
        checksums.add(found[0])
    assert len(checksums) == 1, each_rank(ranks)
    assert "bytes sent as float16 (half of float32's)" in ranks[0][0], each_rank(ranks)


TEARDOWN = """
import os, torch, torch.distributed as dist
{first}
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)  # imports torch.distributed.nn
dist.destroy_process_group()
tasks = os.listdir("/proc/self/task")
print(sorted(open(f"/proc/self/task/{{t}}/comm").read().strip() for t in tasks))
"""


def threads_after_teardown(first: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", TEARDOWN.format(first=first)],
        capture_output=True,
        text=True,
        timeout=600,  # (a loaded machine: importing torch alone can take a minute)
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.dist
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_no_gloo_thread_outlives_destroy_process_group_when_graphamp_fx_is_imported_first():
    """The cause of the data-parallel example's rare abort at exit (rank 1, 'terminate called
    without an active exception'): an optimizer made after init_process_group imports
    torch.distributed.nn, whose default arguments then hold the process group, so gloo's
    threads were still running as the interpreter finalized. graphamp.fx imports it first."""
    assert "gloo" in threads_after_teardown(first="")  # what torch alone does
    assert "gloo" not in threads_after_teardown(first="import graphamp.fx")


@pytest.mark.dist
def test_a_process_group_pinned_by_a_late_import_is_warned_about(tmp_path):
    script = tmp_path / "late.py"
    script.write_text(
        "import warnings, torch, torch.distributed as dist\n"
        'dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)\n'
        "import graphamp, graphamp.fx\n"
        "model = torch.nn.Linear(4, 2)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        '    warnings.simplefilter("always")\n'
        "    graphamp.fx.train_step(model, torch.nn.functional.mse_loss, optimizer,\n"
        '                           process_group="world")\n'
        "print([str(w.message) for w in caught if w.category is graphamp.TeardownWarning])\n"
        "dist.destroy_process_group()\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert "import graphamp.fx before init_process_group" in done.stdout


def test_compile_gets_the_functional_all_reduce():
    """torch.compile refuses an op whose output aliases its input: compile() swaps the
    in-place bucket reduction for the functional one, arguments unchanged."""
    from graphamp.fx.distributed.data_parallel import without_in_place_collectives

    graph = torch.fx.Graph()
    buffer = graph.placeholder("bucket")
    ops = torch.ops._c10d_functional
    reduced = graph.call_function(ops.all_reduce_.default, (buffer, "sum", "0"))
    graph.output(graph.call_function(ops.wait_tensor.default, (reduced,)))
    module = without_in_place_collectives(torch.fx.GraphModule(torch.nn.Module(), graph))
    targets = [n.target for n in module.graph.nodes if n.op == "call_function"]
    assert targets == [ops.all_reduce.default, ops.wait_tensor.default]
    assert next(n for n in module.graph.nodes if n.target == targets[0]).args == (
        buffer,
        "sum",
        "0",
    )


def test_buckets_close_as_ddp_closes_them_with_a_smaller_first_one():
    sizes = [("b2", 16), ("w2", 512), ("b1", 128), ("w1", 2048), ("b0", 8)]
    # a bucket closes once it reaches the capacity, the value that reaches it included
    assert buckets(sizes, 600) == [["b2", "w2", "b1"], ["w1"], ["b0"]]
    assert buckets(sizes, 10_000) == [["b2", "w2", "b1", "w1", "b0"]]
    # the first bucket has a capacity of its own (DDP's 1 MiB under its default 25 MiB)
    assert buckets(sizes, 10_000, first=100) == [["b2", "w2"], ["b1", "w1", "b0"]]
    assert buckets([], 600, first=100) == []
    with pytest.raises(GraphampError, match="first_bucket_bytes must be positive"):
        GradientReduce("7", world_size=2, first_bucket_bytes=0)


@pytest.mark.dist
def test_a_ddp_wrapped_module_is_refused_with_what_to_pass_instead():
    """DistributedDataParallel(model) given to train_step failed inside torch.export with a
    message pointing at contextlib.py."""
    code = """
import torch, torch.distributed as dist, graphamp.fx
from torch import nn
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
try:
    graphamp.fx.train_step(model, nn.functional.mse_loss, torch.optim.SGD(model.parameters()))
except graphamp.GraphampError as error:
    print(error)
dist.destroy_process_group()
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True
    )
    assert "wrapped in DistributedDataParallel; give the module inside" in done.stdout
