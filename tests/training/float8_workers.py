"""What each of two gloo ranks runs for the float8 data-parallel and sharded tests
(tests/training/test_float8_distributed.py; spawned processes import this module by name, so
it holds no tests): a float8 step on this rank's half of each global batch, replicated over
the process group (DDP-style) and sharded with FSDP2 over a mesh."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

import graphamp
import graphamp.fx
from tests.training.dist_workers import WORLD

STEPS = 4
LR = 0.05
# name -> (recipe, how the step spans the ranks)
SCENARIOS = {
    "ddp current": ("current", "process_group"),
    "ddp delayed": ("delayed", "process_group"),
    "fsdp current": ("current", "mesh"),
    "fsdp delayed": ("delayed", "mesh"),
}


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16))


def settings(recipe: str) -> graphamp.Float8 | None:
    if recipe == "bfloat16":
        return None
    if recipe == "delayed":
        return graphamp.Float8.delayed(history=4, sizes="none", keep_last=False)
    return graphamp.Float8.current(sizes="none", keep_last=False)


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(8, 16, generator=generator), torch.randn(8, 16, generator=generator))
        for _ in range(STEPS)
    ]


def train(recipe: str, spans: str | None, rank: int | None, mesh: Any = None) -> dict[str, Any]:
    """STEPS AdamW steps: on this rank's half over the group (``spans`` given) or on the whole
    batch in one process."""
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    extra: dict[str, Any] = {}
    if spans == "process_group":
        extra["process_group"] = "world"
    elif spans == "mesh":
        extra["mesh"] = mesh
    step = graphamp.fx.train_step(
        model, nn.functional.mse_loss, optimizer, dtype="bfloat16", fp8=settings(recipe), **extra
    )
    for x, y in batches():
        if rank is not None:
            x, y = x[rank * 4 : rank * 4 + 4], y[rank * 4 : rank * 4 + 4]
        step(x, y)
    if spans == "mesh":
        params = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    else:
        params = {n: p.clone() for n, p in step.params.items()}
    nodes = step.plan.nodes if step.plan else {}
    return {
        "params": params,
        "state": {k: v.clone() for k, v in step.scaling_state_dict().items()},
        "skipped": int(step.skipped_steps),
        "update": {n: d.reason for n, d in nodes.items() if n == "float8.scale_update"},
        "gemms": sorted(n for n in nodes if n.endswith((".output", ".grad_input", ".grad_weight"))),
        "gathered": sorted({str(d.precision) for n, d in nodes.items() if "all_gather" in n}),
    }


def worker(rank: int, port: int, out: str) -> None:
    """Every scenario on this rank (dist_workers.spawn runs it and leaves without
    finalizing, as DTensor's caches hold the gloo group)."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        torch.set_num_threads(1)
        results = {
            name: train(recipe, spans, rank, mesh) for name, (recipe, spans) in SCENARIOS.items()
        }
        torch.save(results, Path(out) / f"rank{rank}.pt")
        dist.barrier()  # tear down together: a rank leaving first can abort gloo's threads
    finally:
        dist.destroy_process_group()
