"""What each gloo rank runs for tests/training/test_sharded.py (spawned processes import this module
by name, so it holds no tests): graphamp's sharded step and FSDP2 + MixedPrecisionPolicy +
autocast + ShardedGradScaler, on the same model, data and split. Every worker saves its
results to ``<out>/rank<r>.pt``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

import graphamp
import graphamp.fx
from graphamp.errors import GraphampError
from tests.training.dist_workers import free_port, leave_without_finalizing

STEPS = 20
GLOBAL_BATCH = 8
LR = 0.05


def spawn(worker: Any, out: Path, world: int, *args: Any) -> list[dict[str, Any]]:
    """Run ``worker(rank, port, world, out, *args)`` on ``world`` processes; their results."""
    torch.multiprocessing.spawn(worker, args=(free_port(), world, str(out), *args), nprocs=world)
    return [torch.load(out / f"rank{rank}.pt") for rank in range(world)]


def net(idle: bool = False) -> nn.Module:
    # 32 rows shard evenly; the last layer's 3 rows do not (2 + 1 on two ranks, 1 + 1 + 1 + 0
    # on four). Tanh, not ReLU: no kink to turn a rounding difference into a gradient.
    torch.manual_seed(0)
    if idle:
        return WithIdle(nn.Linear(5, 32), nn.Tanh(), nn.Linear(32, 3))
    return nn.Sequential(nn.Linear(5, 32), nn.Tanh(), nn.Linear(32, 3))


class WithIdle(nn.Sequential):
    """A net with a layer the loss has no gradient path from (AdamW skips it: no decay)."""

    def __init__(self, *layers: nn.Module) -> None:
        super().__init__(*layers)
        self.idle = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self[2](self[1](self[0](x)))


def batches(poison: tuple[int, int] | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """STEPS global batches; ``poison`` = (step, rank) puts an inf into that rank's rows."""
    generator = torch.Generator().manual_seed(1)
    out = []
    for index in range(STEPS):
        x = torch.randn(GLOBAL_BATCH, 5, generator=generator)
        y = torch.randn(GLOBAL_BATCH, 3, generator=generator)
        if poison is not None and poison[0] == index:
            x[poison[1] * GLOBAL_BATCH // dist.get_world_size(), 0] = float("inf")
        out.append((x, y))
    return out


def mine(batch: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """This rank's rows of a global batch."""
    rows = len(batch[0]) // dist.get_world_size()
    start = dist.get_rank() * rows
    return [t[start : start + rows] for t in batch]


def sharded_net(mesh: DeviceMesh, reduce: str, idle: bool = False) -> nn.Module:
    """``net()`` sharded as FSDP2 users shard it: the first layer, then the root."""
    policy = MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=getattr(torch, reduce))
    model = net(idle)
    fully_shard(model[0], mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def optimizer(model: nn.Module, kind: str) -> torch.optim.Optimizer:
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def graphamp_step(model: nn.Module, settings: dict[str, Any], **extra: Any) -> Any:
    return graphamp.fx.train_step(
        model,
        nn.functional.mse_loss,
        optimizer(model, settings.get("optim", "sgd")),
        dtype="float16",
        loss_scaling=graphamp.DynamicLossScaling.torch_defaults(),
        clip_grad_norm=settings.get("clip"),
        **extra,
    )


def summary(model: nn.Module, scales: list[float], skipped: list[int]) -> dict[str, Any]:
    """The whole parameters (gathered: a collective on every rank), the shards, the loss scale
    after every step and the steps skipped."""
    return {
        "params": {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()},
        "local": {n: p.to_local().detach().clone() for n, p in model.named_parameters()},
        "scales": scales,
        "skipped": skipped,
    }


def run_graphamp(settings: dict[str, Any], mesh: DeviceMesh) -> dict[str, Any]:
    if settings.get("mesh_argument"):  # the step shards the model itself
        model = net()
        step = graphamp_step(model, settings, mesh=mesh)
    else:
        model = sharded_net(mesh, settings.get("reduce", "float32"), settings.get("idle", False))
        step = graphamp_step(model, settings)
    scales, skipped = [], []
    data = batches(settings.get("poison"))
    if settings.get("compile"):
        step.compile(*mine(data[0]))
    for index, batch in enumerate(data):
        before = int(step.skipped_steps)
        step(*mine(batch))
        scales.append(float(step.loss_scale))
        if int(step.skipped_steps) > before:
            skipped.append(index)
    result = summary(model, scales, skipped)
    nodes = step.plan.nodes if step.plan else {}
    result["collectives"] = {
        name: (str(d.precision), d.reason)
        for name, d in nodes.items()
        if name.startswith(("all_gather", "reduce_scatter", "all_reduce", "clip_grad_norm"))
    }
    result["code"] = step.graph.code
    result["state_bytes"] = step.state_bytes()
    return result


def run_fsdp(settings: dict[str, Any], mesh: DeviceMesh) -> dict[str, Any]:
    """FSDP2 + MixedPrecisionPolicy + autocast + ShardedGradScaler (GradScaler's defaults)."""
    model = sharded_net(mesh, settings.get("reduce", "float32"), settings.get("idle", False))
    opt = optimizer(model, settings.get("optim", "sgd"))
    scaler = ShardedGradScaler("cpu")
    scales, skipped = [], []
    for index, batch in enumerate(batches(settings.get("poison"))):
        x, y = mine(batch)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        if settings.get("clip") is not None:
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), settings["clip"])
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        if scaler.get_scale() < before:  # GradScaler backs off exactly on a skipped step
            skipped.append(index)
    result = summary(model, scales, skipped)
    held = [p.to_local() for p in model.parameters()]
    held += [p.grad.to_local() for p in model.parameters() if p.grad is not None]
    held += [v.to_local() for s in opt.state.values() for v in s.values() if v.dim() > 0]
    result["state_bytes"] = sum(t.numel() * t.element_size() for t in held)
    return result


def run_checkpointed(settings: dict[str, Any], mesh: DeviceMesh, folder: str) -> dict[str, Any]:
    """Half the steps, a torch.distributed.checkpoint save, a new model and optimizer loaded
    from it (and the loss scale), the other half."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    data = batches()
    model = sharded_net(mesh, "float32")
    step = graphamp_step(model, settings)
    for batch in data[: STEPS // 2]:
        step(*mine(batch))
    step.copy_to()  # the optimizer state into the optimizer, as DTensors
    model_state, optim_state = get_state_dict(model, step.optimizer)
    state = {"model": model_state, "optim": optim_state, "scaling": step.scaling_state_dict()}
    dcp.save(state, checkpoint_id=folder)

    resumed = sharded_net(mesh, "float32")
    with torch.no_grad():
        for p in resumed.parameters():
            p.to_local().zero_()  # nothing of the first run left but what is loaded
    opt = optimizer(resumed, "sgd")
    model_state, optim_state = get_state_dict(resumed, opt)
    state = {"model": model_state, "optim": optim_state, "scaling": step.scaling_state_dict()}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(resumed, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    again = graphamp.fx.train_step(
        resumed,
        nn.functional.mse_loss,
        opt,
        dtype="float16",
        loss_scaling=graphamp.DynamicLossScaling.torch_defaults(),
    )
    again.load_scaling_state_dict(state["scaling"])
    scales = []
    for batch in data[STEPS // 2 :]:
        again(*mine(batch))
        scales.append(float(again.loss_scale))
    return summary(resumed, scales, [])


def bad_inputs(mesh: DeviceMesh) -> dict[str, str]:
    """The one-line error of each bad input, with no step run."""
    errors = {}
    # a mesh of this rank alone, and a process group of both ranks
    singles = [dist.new_group([rank]) for rank in range(dist.get_world_size())]
    alone = DeviceMesh.from_group(singles[dist.get_rank()], "cpu")
    cases = {
        "mesh": lambda: graphamp_step(sharded_net(alone, "float32"), {}, process_group="world"),
        "optimizer": lambda: _optimizer_before_sharding(mesh),
        "grad_dtype": lambda: graphamp_step(sharded_net(mesh, "float32"), {}, grad_dtype="float16"),
    }
    for name, make in cases.items():
        try:
            make()
            errors[name] = "no error"
        except GraphampError as error:
            errors[name] = str(error)
    return errors


def _optimizer_before_sharding(mesh: DeviceMesh) -> Any:
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    fully_shard(model, mesh=mesh)
    return graphamp.fx.train_step(model, nn.functional.mse_loss, opt, dtype="float16")


def worker(rank: int, port: int, world: int, out: str, scenarios: dict[str, Any]) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        mesh = init_device_mesh("cpu", (world,))
        results: dict[str, Any] = {}
        for name, settings in scenarios.items():
            if name == "bad inputs":
                results[name] = bad_inputs(mesh)
            elif name == "checkpoint":
                results[name] = run_checkpointed(settings, mesh, str(Path(out) / "checkpoint"))
            else:
                results[name] = run_graphamp(settings, mesh)
                if settings.get("reference", True):
                    results[f"{name} fsdp"] = run_fsdp(settings, mesh)
        torch.save(results, Path(out) / f"rank{rank}.pt")
        dist.barrier()  # tear down together: a rank leaving first can abort gloo's threads
    finally:
        dist.destroy_process_group()
    # DTensor's sharding-propagation and redistribution caches hold the device mesh, and so
    # its gloo group, past destroy_process_group (FSDP2 alone does it too): its threads would
    # run on into interpreter finalization, where a rank can abort now and then. The results
    # are saved and every rank is past the barrier: leave without finalizing. (The README's
    # torchrun test exercises an ordinary exit.)
    leave_without_finalizing()
