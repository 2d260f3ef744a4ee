"""Where two training-step configurations of issue 42 spend their time differently, op by op:
``torch.profiler`` over the same steps of each, side by side (issue 42's rule: "where graphamp
is slower, a profile names the ops that make the difference").

    python tools/bench/profile_steps.py --model bert-base --batch 2 \\
        --configs autocast graphamp --threads 1
    python tools/bench/profile_steps.py --model resnet50 --batch 4 \\
        --configs compile+autocast graphamp-compiled --threads 1
    python tools/bench/profile_steps.py --model bert-base --batch 8 --configs compile+autocast \\
        graphamp-compiled-cut graphamp-compiled-whole --threads 1

The configurations are ``tools/bench/bench_speedup.py``'s (its ``CONFIGS``), built from one
model's deep copies and warmed up (``--warmup``: capture and compilation happen there);
``graphamp-compiled-cut`` and ``-whole`` are graphamp's compiled step cut in forward and rest
or handed to inductor whole, whichever ``partition.cut_pays`` would choose. Then
``--rounds`` rounds each time one step of every configuration in turn (wall clock; a neighbour's
load falls on all alike: the ratio to the first configuration is the median of the per-round
ratios; beside it this thread's CPU time, which with ``--threads 1`` leaves out what a loaded
machine gave to other processes), and one more round profiles ``--profiled`` steps of each. The
table lists, per op, each configuration's self CPU milliseconds and calls a step, sorted by the
largest difference from the first configuration, and beneath it the same time in groups: matrix
products (convolutions, mm/addmm/bmm, attention), casts and copies, optimizer (``_foreach_*``),
inductor's generated kernels (each under its own name: ``cpp.enable_kernel_profile``), and the
rest. On a loaded machine read the ratios and counts, not the milliseconds.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tools" / "gpu"), str(ROOT / "tools" / "bench")]

import bench_speedup  # noqa: E402
import gpu_train  # noqa: E402
import torch  # noqa: E402
import torch._inductor.config  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from graphamp.fx.training import partition  # noqa: E402

CPU = torch.device("cpu")

# op-name groups of the summary, first match wins
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "matrix products",
        (
            "aten::mm",
            "aten::addmm",
            "aten::bmm",
            "aten::baddbmm",
            "aten::matmul",
            "aten::linear",
            "aten::convolution",
            "aten::_convolution",
            "aten::mkldnn_convolution",
            "aten::convolution_backward",
            "aten::_scaled_dot_product",
            "aten::_weight_int",
            "mkldnn::",
            "onednn::",
        ),
    ),
    ("casts and copies", ("aten::_to_copy", "aten::copy_", "aten::to", "aten::clone")),
    ("optimizer (foreach)", ("aten::_foreach_", "aten::_fused_")),
    ("inductor kernels", ("cpp_fused", "graph_", "kernel_cpp", "cpp_")),
)


# graphamp's compiled step cut in two graphs, or whole, whatever partition.cut_pays says
FORCED_CUT = {"graphamp-compiled-cut": True, "graphamp-compiled-whole": False}


@contextmanager
def forced_cut(cut: bool | None) -> Iterator[None]:
    """With ``cut`` true or false, ``partition.cut_pays`` answers it while the block runs."""
    if cut is None:
        yield
        return
    chosen = partition.cut_pays
    partition.cut_pays = lambda module: cut
    try:
        yield
    finally:
        partition.cut_pays = chosen


def group_of(name: str) -> str:
    for group, prefixes in GROUPS:
        if any(name.startswith(prefix) for prefix in prefixes):
            return group
    return "the rest"


def self_times(steps: list[Callable[..., Any]], batch: tuple, profiled: int) -> list[dict]:
    """Per configuration: op name -> (self CPU ms a step, calls a step)."""
    tables = []
    for run in steps:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(profiled):
                run(*batch)
        table = {}
        for event in prof.key_averages():
            if event.key.startswith("ProfilerStep") or event.self_cpu_time_total == 0:
                continue
            table[event.key] = (
                event.self_cpu_time_total / 1e3 / profiled,
                event.count / profiled,
            )
        tables.append(table)
    return tables


def timed_rounds(
    steps: list[Callable[..., Any]], batch: tuple, rounds: int
) -> tuple[list[list[float]], list[list[float]]]:
    """Per configuration, the wall seconds and this thread's CPU seconds of one step in each
    of ``rounds`` rounds. With one thread (``--threads 1``) the step computes on this thread,
    so its CPU time leaves out the time a loaded machine gave to other processes."""
    wall: list[list[float]] = [[] for _ in steps]
    cpu: list[list[float]] = [[] for _ in steps]
    for _ in range(rounds):
        for i, run in enumerate(steps):
            start, start_cpu = time.perf_counter(), time.thread_time()
            run(*batch)
            wall[i].append(time.perf_counter() - start)
            cpu[i].append(time.thread_time() - start_cpu)
    return wall, cpu


def report(
    names: list[str], tables: list[dict], wall: list[list[float]], cpu: list[list[float]], top: int
) -> str:
    lines = []
    ratio_head = " | ".join(f"{name} / {names[0]}" for name in names[1:])
    lines.append(f"| step | {' | '.join(names)} | {ratio_head} |")
    lines.append("|---" * (2 * len(names)) + "|")
    for label, seconds in (("wall", wall), ("thread CPU", cpu)):
        medians = [statistics.median(s) * 1e3 for s in seconds]
        ratios = [
            statistics.median(b / a for a, b in zip(seconds[0], other, strict=True))
            for other in seconds[1:]
        ]
        lines.append(
            f"| median {label} ms ({len(seconds[0])} interleaved rounds) | "
            + " | ".join(f"{m:.0f}" for m in medians)
            + " | "
            + " | ".join(f"{r:.3f}" for r in ratios)
            + " |"
        )
    lines.append("")
    head = " | ".join(f"{name} ms | {name} calls" for name in names)
    lines.append(f"| op | {head} | largest difference ms |")
    lines.append("|---" * (2 * len(names) + 2) + "|")
    ops = set().union(*tables)

    def spread(op: str) -> float:
        first = tables[0].get(op, (0.0, 0))[0]
        return max(abs(t.get(op, (0.0, 0))[0] - first) for t in tables[1:])

    for op in sorted(ops, key=spread, reverse=True)[:top]:
        cells = " | ".join(
            f"{t.get(op, (0.0, 0))[0]:.1f} | {t.get(op, (0.0, 0))[1]:g}" for t in tables
        )
        lines.append(f"| {op} | {cells} | {spread(op):.1f} |")
    lines.append("")
    lines.append(f"| group | {' | '.join(f'{n} ms | {n} calls' for n in names)} |")
    lines.append("|---" * (2 * len(names) + 1) + "|")
    for group in [g for g, _ in GROUPS] + ["the rest", "all"]:
        cells = []
        for table in tables:
            rows = [v for k, v in table.items() if group == "all" or group_of(k) == group]
            cells.append(f"{sum(r[0] for r in rows):.1f} | {sum(r[1] for r in rows):g}")
        lines.append(f"| {group} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=gpu_train.WORKLOADS, default="bert-base")
    parser.add_argument(
        "--configs", nargs="+", choices=(*bench_speedup.CONFIGS, *FORCED_CUT), required=True
    )
    parser.add_argument("--batch", type=int, help="training batch (default: the bench's, 8)")
    parser.add_argument("--image", type=int, help="ResNet-50's input side (default 224)")
    parser.add_argument("--seq", type=int, help="BERT-base's sequence (default 128)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="timed interleaved rounds")
    parser.add_argument("--profiled", type=int, default=1, help="profiled steps of each")
    parser.add_argument("--top", type=int, default=25, help="ops listed")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads")
    parser.add_argument("--scale", choices=("cpu", "tiny"), default="cpu", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    # each generated C++ kernel under its own name in the profile (a record per kernel call)
    torch._inductor.config.cpp.enable_kernel_profile = True
    warnings.filterwarnings("ignore")
    sizes = {
        key: value
        for key, value in (("batch", args.batch), ("image", args.image), ("seq", args.seq))
        if value is not None and args.model in bench_speedup._ACCEPTS[key]
    }
    work = gpu_train.workload(args.model, args.scale, **sizes)
    batch = work.batch(0, CPU)
    base = work.build(0)
    steps = []
    for key in args.configs:
        model = copy.deepcopy(base).train()
        mode = bench_speedup.CONFIGS[key.removesuffix("-cut").removesuffix("-whole")]
        with forced_cut(FORCED_CUT.get(key)):  # the step is compiled at its first call
            run = gpu_train.step_function(mode, work, model, CPU)
            for _ in range(args.warmup):
                run(*batch)
        steps.append(run)
        print(f"{key} warmed up", file=sys.stderr, flush=True)
    wall, cpu = timed_rounds(steps, batch, args.rounds)
    tables = self_times(steps, batch, args.profiled)
    print(f"{args.model} {sizes}, {torch.get_num_threads()} threads, torch {torch.__version__}\n")
    print(report(list(args.configs), tables, wall, cpu, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
