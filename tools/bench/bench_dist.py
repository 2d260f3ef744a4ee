"""Data-parallel training steps on two processes (gloo, this CPU): step time and bytes
all-reduced per step, graphamp's step graph (float32 and float16 gradients) against
DistributedDataParallel + torch.autocast + GradScaler (without and with fp16_compress_hook).

    python tools/bench/bench_dist.py [--steps 20] [--runs 1] [--width 512] [--batch 64] [--compile]
                               [--compute float16|bfloat16] [--sharded]

Every configuration computes in float16 (``--compute bfloat16``: bfloat16, for CPUs that
emulate float16 matrix products, where the emulation would hide every other cost) with
dynamic loss scaling, SGD with momentum 0.9; each rank trains on its half of the batch with
one thread (two processes on two cores). Bytes are the all-reduce payload per rank per step
(what each rank hands to the collective: with two ranks a ring all-reduce also sends about
that much): for graphamp, the buffers of the _c10d_functional.all_reduce nodes of its graph
(the gradient buckets); for DDP, the bucket buffers its communication hook is given (a
counting wrapper around allreduce_hook / fp16_compress_hook, in a separate run so it does not
touch the timings).
Time is the median step of each rank, the slower rank reported; the configurations take
turns step by step, so the load of a shared machine falls on all of them alike. With
``--runs N`` the processes start N times: each ratio is the median of the runs' ratios, with
their range.
``--compile`` adds graphamp's steps under torch.compile (inductor schedules the collectives).

With ``--sharded`` the configurations are sharded steps instead: graphamp's step on a model
sharded with FSDP2's fully_shard (each layer, then the root; MixedPrecisionPolicy in the
compute type), float32 and float16 gradients, against FSDP2 + autocast + ShardedGradScaler on
the same sharded model (reduce_dtype float32 / float16); bytes are what each rank hands to or
receives from the collectives per step (FSDP2's: every parameter gathered in forward and
again in backward, as reshard_after_forward does, and every gradient reduce-scattered), and
the table adds the bytes of parameters, gradients and optimizer state each rank holds
between steps.

Models: the zoo's SimpleNet (3 x Linear + ReLU, ``--width``) and the zoo's BERT encoder
(``models/transformer.py``, sized by ``--bert-*``; loss on the pooled output).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import machine

WORLD = 2
CONFIGS = (
    "graphamp, float32 gradients",
    "graphamp, float16 gradients",
    "DDP + autocast + GradScaler",
    "DDP + autocast + GradScaler + fp16_compress_hook",
)
COMPILED = (
    "graphamp, float32 gradients, torch.compile",
    "graphamp, float16 gradients, torch.compile",
)
# --sharded: parameters, gradients and optimizer state sharded over the two ranks
SHARDED = (
    "graphamp sharded, float32 gradients",
    "graphamp sharded, float16 gradients",
    "FSDP2 + autocast + ShardedGradScaler",
    "FSDP2 + autocast + ShardedGradScaler, float16 reduce",
)


def build(name: str, args: argparse.Namespace) -> tuple[nn.Module, tuple, Callable]:
    """The model, one global batch (inputs..., target) and the loss."""
    torch.manual_seed(0)
    if name == "simplenet":
        from graphamp.models.simplenet import SimpleNet

        batch = (torch.randn(args.batch, args.width), torch.randn(args.batch, args.width))
        return SimpleNet(args.width), batch, nn.functional.mse_loss
    from graphamp.models.transformer import BertEncoder

    hidden, seq, batch_size = args.bert_hidden, args.bert_seq, args.bert_batch
    model = BertEncoder(args.bert_vocab, hidden, args.bert_layers, 4, 4 * hidden, seq)
    ids = torch.randint(1, args.bert_vocab, (batch_size, seq))
    types = torch.randint(0, 2, (batch_size, seq))

    def pooled_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(output[1].float(), target)

    return model, (ids, types, torch.randn(batch_size, hidden)), pooled_loss


def graphamp_step(
    model: nn.Module, loss_fn: Callable, grad_dtype: str | None, compute: str
) -> Callable:
    import graphamp.fx

    return graphamp.fx.train_step(
        model,
        loss_fn,
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        dtype=compute,
        loss_scaling=graphamp.fx.DynamicLossScaling.torch_defaults(),
        process_group="world",
        grad_dtype=grad_dtype,
    )


def graph_bytes(step: Any) -> int:
    """The payload of the collectives of a graphamp step graph: what each rank hands to the
    all-reduces and reduce-scatters, and receives from the all-gathers."""
    total = 0
    for node in step.graph.graph.nodes:
        target = str(node.target)
        if node.op != "call_function" or "_c10d_functional" not in target or "wait" in target:
            continue
        value = node.args[0].meta["val"]
        gathered = WORLD if "all_gather" in target else 1
        total += value.numel() * value.element_size() * gathered
    return total


def fsdp_model(model: nn.Module, compute: str, reduce: str) -> nn.Module:
    """``model`` sharded as FSDP2 users shard it: each layer, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))
    policy = MixedPrecisionPolicy(
        param_dtype=getattr(torch, compute), reduce_dtype=getattr(torch, reduce)
    )
    for layer in model.layers:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def fsdp_step(model: nn.Module, loss_fn: Callable, compute: str) -> Callable:
    """FSDP2 + MixedPrecisionPolicy + autocast + ShardedGradScaler, as its users write it."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = ShardedGradScaler("cpu")

    def run(*batch: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=getattr(torch, compute)):
            loss = loss_fn(model(*batch[:-1]), batch[-1])
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    run.held = lambda: held_bytes(model, optimizer)  # type: ignore[attr-defined]
    return run


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters, gradients and optimizer state this rank holds between steps."""
    local = [getattr(p, "_local_tensor", p) for p in model.parameters()]
    local += [
        getattr(p.grad, "_local_tensor", p.grad) for p in model.parameters() if p.grad is not None
    ]
    local += [getattr(v, "_local_tensor", v) for s in optimizer.state.values() for v in s.values()]
    return sum(t.numel() * t.element_size() for t in local)


def ddp_step(
    model: nn.Module, loss_fn: Callable, compress: bool, compute: str, counter: list | None
):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    wrapped = nn.parallel.DistributedDataParallel(model)
    hook = default_hooks.fp16_compress_hook if compress else default_hooks.allreduce_hook
    if counter is not None:

        def counting(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads annotations
            buffer = bucket.buffer()
            # fp16_compress_hook sends the bucket as float16: half its float32 bytes
            counter.append(buffer.numel() * (2 if compress else buffer.element_size()))
            return hook(state, bucket)

        wrapped.register_comm_hook(dist.group.WORLD, counting)
    elif compress:
        wrapped.register_comm_hook(dist.group.WORLD, hook)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")

    def run(*batch: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=getattr(torch, compute)):
            loss = loss_fn(wrapped(*batch[:-1]), batch[-1])
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    return run


def prepare(rank: int, name: str, config: str, args: argparse.Namespace) -> tuple:
    """(a step function, this rank's half batch, bytes communicated per step, bytes held)."""
    model, batch, loss_fn = build(name, args)
    half = len(batch[0]) // WORLD
    mine = tuple(t[rank * half : (rank + 1) * half] for t in batch)
    if config.startswith(("graphamp sharded", "FSDP2")):
        reduce = "float16" if "float16" in config else "float32"
        model = fsdp_model(model, args.compute, reduce)
        if config.startswith("FSDP2"):
            step = fsdp_step(model, loss_fn, args.compute)
            step(*mine)
            return step, mine, fsdp_bytes(model, args.compute, reduce), step.held()
        step = graphamp_step(model, loss_fn, None, args.compute)
        step(*mine)
        return step, mine, graph_bytes(step), step.state_bytes()
    if config.startswith("graphamp"):
        grad_dtype = "float16" if "float16" in config else None
        step = graphamp_step(model, loss_fn, grad_dtype, args.compute)
        if config.endswith("torch.compile"):
            step.compile(*mine)
        step(*mine)  # captured on the first call
        return step, mine, graph_bytes(step), step.state_bytes()
    counter: list[int] = []  # one counted step, on a wrapper of its own
    compress = "fp16" in config
    ddp_step(build(name, args)[0], loss_fn, compress, args.compute, counter)(*mine)
    step = ddp_step(model, loss_fn, compress, args.compute, None)
    return step, mine, sum(counter), 0


def fsdp_bytes(model: nn.Module, compute: str, reduce: str) -> int:
    """FSDP2's payload per step: every parameter gathered twice in the compute type
    (forward, and again in backward, reshard_after_forward=True on all but the root's own),
    every gradient reduce-scattered in ``reduce``."""
    item = {"float32": 4, "float16": 2, "bfloat16": 2}
    whole = sum(p.numel() for p in model.parameters())
    root = sum(p.numel() for p in model.parameters(recurse=False))
    return (2 * whole - root) * item[compute] + whole * item[reduce]


def measure(rank: int, name: str, args: argparse.Namespace) -> dict[str, tuple[float, int]]:
    """Per configuration: (median seconds per step on this rank, bytes all-reduced per
    step). The configurations take turns, one step each per round, so a change in the load
    of this shared machine falls on all of them alike."""
    prepared = {config: prepare(rank, name, config, args) for config in configs(args)}
    for step, mine, *_ in prepared.values():
        for _ in range(args.warmup):
            step(*mine)
    times: dict[str, list[float]] = {config: [] for config in prepared}
    for _ in range(args.steps):
        for config, (step, mine, *_) in prepared.items():
            dist.barrier()
            start = time.perf_counter()
            step(*mine)
            times[config].append(time.perf_counter() - start)
    held = {c: prepared[c][3] for c in prepared}
    if args.sharded:  # FSDP2's gradients stay between steps: held after the last one
        held.update({c: prepared[c][0].held() for c in prepared if c.startswith("FSDP2")})
    return {c: (statistics.median(times[c]), prepared[c][2], held[c]) for c in prepared}


def configs(args: argparse.Namespace) -> tuple[str, ...]:
    if args.sharded:
        return SHARDED
    return CONFIGS + COMPILED if args.compile else CONFIGS


def baseline(config: str) -> str:
    """The configuration a graphamp one is compared with: the same gradient type."""
    if config.startswith("graphamp sharded"):
        return SHARDED[3] if "float16" in config else SHARDED[2]
    return CONFIGS[3] if "float16" in config else CONFIGS[2]


def worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    import graphamp.fx  # noqa: F401  # before the group exists (README: torchrun)

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    results = {}
    for name in args.models:
        for config, (seconds, sent, held) in measure(rank, name, args).items():
            slowest = torch.tensor([seconds])
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            results[(name, config)] = (float(slowest), sent, held)
    if rank == 0:
        torch.save(results, out)
    dist.barrier()  # tear down together: a rank leaving first can abort gloo's threads
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["simplenet", "bert"])
    parser.add_argument("--width", type=int, default=512, help="SimpleNet width")
    parser.add_argument("--batch", type=int, default=64, help="SimpleNet global batch")
    parser.add_argument("--compile", action="store_true", help="also graphamp + torch.compile")
    parser.add_argument(
        "--sharded",
        action="store_true",
        help="sharded steps instead: graphamp on an FSDP2 model against FSDP2 + autocast + "
        "ShardedGradScaler, with the bytes each rank holds",
    )
    parser.add_argument(
        "--compute",
        choices=("float16", "bfloat16"),
        default="float16",
        help="the type every configuration computes in (gradients travel as the table says)",
    )
    parser.add_argument("--bert-vocab", type=int, default=1000)
    parser.add_argument("--bert-hidden", type=int, default=128)
    parser.add_argument("--bert-layers", type=int, default=2)
    parser.add_argument("--bert-seq", type=int, default=32)
    parser.add_argument("--bert-batch", type=int, default=8, help="BERT global batch")
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="start the two processes this many times; the table gives the median run and "
        "the range of the ratios (single runs on a shared machine spread by several percent)",
    )
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    runs = []
    for run in range(args.runs):
        runs.append(one_run(args))
        if args.runs > 1:
            print(f"run {run + 1} of {args.runs} done", file=sys.stderr, flush=True)
    print(f"machine: {machine()}; torch {torch.__version__}; 2 processes (gloo), 1 thread each")
    print(
        f"sizes: SimpleNet {args.width} wide, global batch {args.batch}; BERT hidden "
        f"{args.bert_hidden}, {args.bert_layers} layers, vocab {args.bert_vocab}, seq "
        f"{args.bert_seq}, global batch {args.bert_batch}; computing in {args.compute}; "
        f"median of {args.steps} steps" + (f", median of {args.runs} runs" if args.runs > 1 else "")
    )
    print()
    if args.sharded:
        print(
            "| model | configuration | ms/step | bytes communicated/step | parameters + "
            "gradients + optimizer state held/rank | vs FSDP2, same gradient type |"
        )
        print("|---|---|---|---|---|---|")
    else:
        print(
            "| model | configuration | ms/step | bytes all-reduced/step "
            "| vs DDP, same gradient type |"
        )
        print("|---|---|---|---|---|")
    for name in args.models:
        for config in configs(args):
            seconds = statistics.median(r[(name, config)][0] for r in runs)
            sent, held = runs[0][(name, config)][1:]
            ratio = ""
            if config.startswith("graphamp"):
                same = baseline(config)
                ratios = sorted(r[(name, same)][0] / r[(name, config)][0] for r in runs)
                ratio = f"{statistics.median(ratios):.2f}x as fast"
                if len(ratios) > 1:
                    ratio += f" ({ratios[0]:.2f}-{ratios[-1]:.2f})"
            kept = f" {held:,} |" if args.sharded else ""
            print(f"| {name} | {config} | {seconds * 1e3:.1f} | {sent:,} |{kept} {ratio} |")
    return 0


def one_run(args: argparse.Namespace) -> dict[tuple[str, str], tuple[float, int, int]]:
    """Start the two processes once; (model, configuration) -> (seconds per step, bytes
    communicated, bytes held)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = Path(f"/tmp/bench_dist.{port}.pt")
    torch.multiprocessing.spawn(worker, args=(port, args, str(out)), nprocs=WORLD)
    results = torch.load(out)
    out.unlink()
    return results


if __name__ == "__main__":
    sys.exit(main())
