"""A data-parallel step on NCCL and a CUDA device, where only one GPU is at hand.

    python tools/gpu/nccl_check.py [--steps 10]

NCCL runs one rank per GPU, so on a machine with one GPU this starts a world of one: the step
graph still holds its gradient all-reduce, the ``found_inf`` agreement and the clipping as
functional collectives on NCCL, over CUDA tensors. It trains docs/distributed.md's model for
``--steps`` float16 steps with dynamic loss scaling and float16 gradients, beside the same
step without a process group, and prints: the collectives in the graph, the largest
difference between the two runs' parameters (float16 gradient transport rounds them), the
loss scales and skipped steps, and the step time of each. Two ranks on gloo are in the tests.
"""

from __future__ import annotations

import argparse
import copy
import os
import time

import torch
import torch.distributed as dist
from torch import nn

import graphamp.fx


def build(process_group: str | None, model: nn.Module) -> graphamp.fx.TrainStep:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return graphamp.fx.train_step(
        model,
        nn.functional.mse_loss,
        optimizer,
        dtype="float16",
        process_group=process_group,
        grad_dtype="float16" if process_group else None,
        clip_grad_norm=1.0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("nccl_check: torch sees no CUDA device")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.Tanh(), nn.Linear(512, 16)).cuda()
    steps = {"nccl": build("world", model), "single": build(None, copy.deepcopy(model))}
    data = torch.Generator(device="cuda").manual_seed(1)
    batches = [
        (
            torch.randn(64, 256, device="cuda", generator=data),
            torch.randn(64, 16, device="cuda", generator=data),
        )
        for _ in range(args.steps)
    ]
    seconds = {}
    for name, step in steps.items():
        step(*batches[0])  # capture and warm up
        torch.cuda.synchronize()
        start = time.perf_counter()
        for x, y in batches[1:]:
            step(x, y)
        torch.cuda.synchronize()
        seconds[name] = (time.perf_counter() - start) / max(len(batches) - 1, 1)
    nccl, single = steps["nccl"], steps["single"]
    collectives = sorted(
        str(n.target) for n in nccl.graph.graph.nodes if "c10d_functional" in str(n.target)
    )
    difference = max(float((nccl.params[k] - single.params[k]).abs().max()) for k in nccl.params)
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(
        f"collectives in the step graph: {len(collectives)} ({', '.join(sorted(set(collectives)))})"
    )
    print(f"largest parameter difference, NCCL float16 gradients vs no group: {difference:.3g}")
    print(
        f"loss scale {float(nccl.loss_scale):g} vs {float(single.loss_scale):g}; "
        f"skipped {int(nccl.skipped_steps)} vs {int(single.skipped_steps)}"
    )
    print(
        f"step time: NCCL {seconds['nccl'] * 1e3:.3f} ms, no group {seconds['single'] * 1e3:.3f} ms"
    )
    print(nccl.explain("all_reduce.0"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
