"""What each of two gloo ranks runs for tests/training/test_distributed.py (spawned processes import
this module by name, so it holds no tests). Every worker saves its results to
``<out>/<scenario>.<rank>.pt`` for the test to compare across ranks and with one process."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import graphamp
import graphamp.fx

WORLD = 2
STEPS = 4
LR = 0.05


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def spawn(worker: Callable[..., None], out: Path, *args: Any) -> list[dict[str, Any]]:
    """Run ``worker(rank, port, out, *args)`` on two processes; each rank's saved results.
    Should a rank fail, the error names each rank's stdout and stderr (kept in ``out``)."""
    try:
        torch.multiprocessing.spawn(
            _logged, args=(worker, free_port(), str(out), *args), nprocs=WORLD
        )
    except Exception as exc:
        raise AssertionError(f"{exc}\n{rank_logs(out)}") from exc
    return [torch.load(out / f"rank{rank}.pt") for rank in range(WORLD)]


def _logged(rank: int, worker: Callable[..., None], *args: Any) -> None:
    """``worker(rank, *args)`` with this process's stdout and stderr in files of ``out``."""
    out = Path(args[1])
    for stream, name in ((sys.stdout, "stdout"), (sys.stderr, "stderr")):
        stream.flush()
        with open(out / f"rank{rank}.{name}", "w") as log:
            os.dup2(log.fileno(), stream.fileno())
    worker(rank, *args)
    # The worker has saved its results, passed the barrier and destroyed its process group.
    # gloo's threads can still be running into interpreter finalization, where a rank can
    # abort ("terminate called without an active exception", SIGABRT) after its work is done
    # and saved: leave without finalizing. A worker that raises never gets here, so spawn
    # still reports its error.
    leave_without_finalizing()


def leave_without_finalizing() -> None:
    """End this rank's process with status 0, its output flushed, skipping interpreter
    finalization (where gloo's threads, still running past ``destroy_process_group``, can abort
    the process). Only for a rank whose results are saved and that is past the last barrier."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def rank_logs(out: Path) -> str:
    parts = []
    for rank in range(WORLD):
        for name in ("stdout", "stderr"):
            log = Path(out) / f"rank{rank}.{name}"
            text = log.read_text(errors="replace") if log.exists() else "(none)"
            parts.append(f"--- rank {rank} {name} ---\n{text}")
    return "\n".join(parts)


def net(seed: int = 0) -> nn.Module:
    # Tanh, not ReLU: a ReLU's kink turns a float16 rounding difference (a half batch's
    # partial sums against the whole batch's) into a gradient that is there or not.
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def batches(
    poison: tuple[int, int] | None = None, last: int = 8
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Global batches of 8, the last one of ``last``; ``poison`` = (step, rank) puts an inf
    into that rank's half."""
    generator = torch.Generator().manual_seed(1)
    out = []
    for index in range(STEPS):
        x, y = torch.randn(8, 16, generator=generator), torch.randn(8, 4, generator=generator)
        if poison is not None and poison[0] == index:
            x[poison[1] * 4, 0] = float("inf")
        out.append((x, y) if index < STEPS - 1 else (x[:last], y[:last]))
    return out


def shard(batch: tuple[torch.Tensor, ...], rank: int) -> list[torch.Tensor]:
    half = len(batch[0]) // 2
    return [t[rank * half : (rank + 1) * half] for t in batch]


def make_step(settings: dict[str, Any], **distributed: Any) -> graphamp.fx.TrainStep:
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    scaling = graphamp.DynamicLossScaling(
        decr_every_n_nan_or_inf=1, incr_every_n_steps=settings.get("grow", 1000)
    )
    return graphamp.fx.train_step(
        model,
        nn.functional.mse_loss,
        optimizer,
        dtype="float16",
        loss_scaling=scaling,
        accumulate=settings.get("accumulate", 1),
        clip_grad_norm=settings.get("clip"),
        **distributed,
    )


def train(settings: dict[str, Any], rank: int | None) -> dict[str, Any]:
    """Train STEPS batches: on this rank's half with a process group (``rank`` given), or on
    the whole batch in one process (``rank`` None)."""
    if rank is None:
        step = make_step(settings)
    else:
        step = make_step(
            settings,
            process_group="world",
            grad_dtype=settings.get("grad_dtype"),
            bucket_bytes=settings.get("bucket_bytes"),
            agree_found_inf=settings.get("agree", False),
        )
    accumulate = settings.get("accumulate", 1)
    for batch in batches(settings.get("poison"), settings.get("last", 8)):
        parts = [batch] if rank is None else [tuple(shard(batch, rank))]
        if accumulate > 1:  # micro-batches: the batch in `accumulate` pieces
            size = len(parts[0][0]) // accumulate
            parts = [
                tuple(t[i * size : (i + 1) * size] for t in parts[0]) for i in range(accumulate)
            ]
        for part in parts:
            step(*part)
    graphs = {"update": step.graph.code}
    if step.accumulate_graph is not None:
        graphs["accumulate"] = step.accumulate_graph.code
    reduce_nodes = {
        name: (str(d.precision), d.reason)
        for name, d in (step.plan.nodes if step.plan else {}).items()
        if name.startswith("all_reduce")
    }
    return {
        "params": {k: v.clone() for k, v in step.params.items()},
        "opt_state": {k: v.clone() for k, v in step.opt_state.items()},
        "skipped": int(step.skipped_steps),
        "scale": float(step.loss_scale),
        "graphs": graphs,
        "reduce_nodes": reduce_nodes,
    }


def _init(rank: int, port: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )


def train_worker(rank: int, port: int, out: str, scenarios: dict[str, dict[str, Any]]) -> None:
    """Each scenario's training on this rank, and the found_inf agreement on its own: this
    rank's flag is set only on rank 1."""
    _init(rank, port)
    try:
        results = {name: train(settings, rank) for name, settings in scenarios.items()}
        from graphamp.core.graph import NodeKind, OpNode
        from graphamp.fx.dialect.lowering import _all_reduce

        group = dist.group.WORLD.group_name  # type: ignore[union-attr]
        node = OpNode("agree", "all_reduce", [], [], kind=NodeKind.ALL_REDUCE)
        node.params = {"op": "max", "group": group, "world_size": WORLD}
        results["agreed"] = bool(_all_reduce(node)(torch.tensor(rank == 1)))
        torch.save(results, Path(out) / f"rank{rank}.pt")
        dist.barrier()  # tear down together: a rank leaving first can abort gloo's threads
    finally:
        dist.destroy_process_group()


def ddp_worker(rank: int, port: int, out: str) -> None:
    """graphamp.fx.convert's module trained under DistributedDataParallel with
    fp16_compress_hook: each rank on its half of the batch."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

    _init(rank, port)
    try:
        results = {"params": ddp_train(rank, fp16_compress_hook)}
        torch.save(results, Path(out) / f"rank{rank}.pt")
        dist.barrier()  # tear down together: a rank leaving first can abort gloo's threads
    finally:
        dist.destroy_process_group()


def ddp_train(rank: int | None, hook: Any = None) -> dict[str, torch.Tensor]:
    """SGD on the converted float16 module: wrapped in DDP (``rank`` given) or alone."""
    x0 = batches()[0][0]
    example = x0 if rank is None else x0[:4]  # the shapes it runs on
    module, _ = graphamp.fx.convert(net(), (example,), dtype="float16")
    trained: nn.Module = module
    if rank is not None:
        trained = nn.parallel.DistributedDataParallel(module)
        trained.register_comm_hook(state=None, hook=hook)
    optimizer = torch.optim.SGD(trained.parameters(), lr=LR, momentum=0.9)
    for batch in batches():
        x, y = batch if rank is None else shard(batch, rank)
        optimizer.zero_grad()
        nn.functional.mse_loss(trained(x).float(), y).backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in module.named_parameters()}
