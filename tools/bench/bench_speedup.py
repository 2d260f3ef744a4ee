"""bfloat16's speed-up at real sizes on this CPU (issue 42): whole training steps and inference
of ResNet-50 and Hugging Face BERT-base against float32 and torch.autocast.

    python tools/bench/bench_speedup.py                       # every part, the issue's sizes
    python tools/bench/bench_speedup.py --part train --models bert-base --repeats 5
    python tools/bench/bench_speedup.py --quick               # every part, tiny: a smoke run

Parts (``--part``, default all):

* ``train``: one training step (forward, loss, backward, optimizer update) of ResNet-50 (the
  zoo's ResNet at full size: bottlenecks 3, 4, 6, 3, torchvision's 25,557,032 parameters;
  224x224, SGD with momentum 0.9 and weight decay) and BERT-base (``transformers.BertConfig``'s
  defaults: 12 layers x 768, SDPA attention; masked-LM loss over sequence 128, AdamW), random
  weights, in seven configurations built side by side: float32 eager, float32
  ``torch.compile``, eager ``torch.autocast``, ``torch.compile`` + autocast, graphamp's
  ``train_step`` eager and compiled, and ``torch.compile(backend=graphamp.fx.backend(...))``
  in the user's loop; and, asked for by name (``--configs ... graphamp-casts-held``), the
  eager ``train_step(recompute_casts=False)``, which holds the weights' casts from forward to
  backward as autocast does (on a CPU the default computes them again). Each is warmed up
  (``--warmup`` steps: capture and compilation happen there), then ``--repeats`` rounds run
  ``--steps`` steps of each configuration in turn, so a neighbour's load falls on all of them
  alike. The figure is the median step (wall clock),
  the process's CPU time a step beside it; the ratios under "bars" are medians over the rounds
  of the ratio within each round.
* ``memory``: the peak memory of one step, each configuration in a fresh process after its
  warm-up: the bytes of every tensor alive at the step's start (parameters, gradients,
  optimizer and loss-scaling state, and the model's own parameters where a step trains copies
  of them) plus the most the step allocates beyond them (torch's CPU allocator, read through
  the profiler's memory events).
* ``curves``: the loss over ``--curve-steps`` steps of eager autocast and of graphamp's step
  from ``--seeds`` initialisations, each cycling over 8 batches it can learn; graphamp's
  curves should lie inside the seed-to-seed spread of autocast's (windows of 10 steps): the
  windows where every graphamp curve lies inside the band of all autocast's, and, fairer
  (``gpu_train.held_out_inside``), the share of windows a graphamp run lies inside the band
  of all but one autocast run beside the same share for each autocast run held out (with 3
  seeds or more; ``tools/bench/curve_spread.py`` reads a saved result again). The
  real architectures at a smaller batch (``--curve-batch``) and input (``--curve-image``,
  ``--curve-seq``). Beside the windows: the last window's loss of each, the NaN/Inf losses,
  the steps graphamp's step guard skipped and each curve's time; a line on stderr every
  tenth of each curve (model, configuration, seed, steps done, seconds so far).
* ``infer``: the model converted once by ``graphamp.fx.convert`` (bfloat16, dynamic batch,
  ``weights="low"``: weights stored in bfloat16, as served), run at each of ``--batches``
  eager and under ``torch.compile``, against float32 and autocast run the same way; the
  error is max |y - y32| / max |y32| against float32 eager.

Sizes: ``--batch`` for training (8), ``--batches`` for inference (1,8,32). Results: Markdown
on stdout and in ``OUT/bench-speedup-<part>.md`` (``--out``, default ``speedup-results``;
``bench-speedup-<part>-<model>.md`` where ``--models`` names fewer than all), JSON beside it,
headed by the machine (CPU model and flags), torch's version, threads and the
load average when the part started and ended: a loaded machine's figures are not the figures.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tools" / "gpu"), str(ROOT / "tools" / "bench")]

import gpu_train  # noqa: E402
import speedup_infer  # noqa: E402
import torch  # noqa: E402
from benchlib import machine  # noqa: E402
from gpu_train import Mode  # noqa: E402

DTYPE = "bfloat16"
CONFIGS: dict[str, Mode] = {
    "float32": Mode("float32"),
    "float32-compiled": Mode("float32", compiled=True),
    "autocast": Mode("autocast", DTYPE),
    "compile+autocast": Mode("compile+autocast", DTYPE),
    "graphamp": Mode("graphamp", DTYPE),
    "graphamp-compiled": Mode("graphamp", DTYPE, compiled=True),
    "backend": Mode("backend", DTYPE),
    # train_step(recompute_casts=False): the weights' casts held, as autocast holds them
    "graphamp-casts-held": Mode("graphamp", DTYPE, recompute_casts=False),
}
GRAPHAMP = ("graphamp", "graphamp-compiled", "backend", "graphamp-casts-held")
EAGER = ("float32", "autocast", "graphamp", "graphamp-casts-held")
# graphamp's best step against float32 compiled the same way, per model (issue 42)
BEST_BAR = {"bert-base": 2.5, "resnet50": 1.8}
MODELS = gpu_train.WORKLOADS
CPU = torch.device("cpu")


def environment() -> str:
    """What the figures were measured on: the machine, torch, threads, the load and memory."""
    return (
        f"{machine()}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"load average {os.getloadavg()[0]:.1f}; {memory()}; {date.today().isoformat()}"
    )


def memory(meminfo: Path = Path("/proc/meminfo")) -> str:
    """Free memory and the page cache, from ``meminfo``. A step's large tensors are mapped
    afresh at every step, and where the free memory runs out the kernel reclaims the page
    cache inside those page faults: BERT-base's eager steps ran 1.3-1.6x slower beside four
    other configurations with 8 GiB of cache held (its system time 0.89 s a step against
    0.39), and as fast once the cache was dropped (History, 2026-11-28)."""
    try:
        fields = dict(
            line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line
        )
        kib = {key: int(fields[key].split()[0]) for key in ("MemFree", "Cached")}
    except (OSError, KeyError, ValueError):
        return "memory not read"
    return f"free {kib['MemFree'] / 2**20:.1f} GiB, page cache {kib['Cached'] / 2**20:.1f} GiB"


def _ratio(numerator: list[float], denominator: list[float]) -> float:
    """The median over rounds of numerator / denominator, each pair measured back to back."""
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))


def _sizes(args: argparse.Namespace, name: str, **extra: Any) -> dict[str, Any]:
    sizes = {"batch": args.batch, **extra}
    return {k: v for k, v in sizes.items() if v is not None and name in _ACCEPTS[k]}


_ACCEPTS = {
    "batch": MODELS,
    "image": ("resnet50",),
    "seq": ("bert-base",),
}


# -- train ----------------------------------------------------------------------------------


def train_part(args: argparse.Namespace) -> tuple[str, dict]:
    lines = [
        "| model | batch | configuration | median step ms | CPU s a step | samples/s "
        "| vs float32 | vs float32 compiled | first steps s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    bars = ["| model | bar | figure | target | met |", "|---|---|---|---|---|"]
    results: dict = {}
    for name in args.models:
        work = gpu_train.workload(name, args.scale, **_sizes(args, name))
        batch = work.batch(0, CPU)
        base = work.build(0)
        steps: dict[str, Callable[..., Any]] = {}
        warm: dict[str, float] = {}
        for key in args.configs:
            run = gpu_train.step_function(CONFIGS[key], work, copy.deepcopy(base).train(), CPU)
            start = time.perf_counter()
            for _ in range(args.warmup):
                run(*batch)
            warm[key] = time.perf_counter() - start
            steps[key] = run
            print(f"  {name}: {key} warmed up in {warm[key]:.1f} s", file=sys.stderr, flush=True)
        wall: dict[str, list[float]] = {key: [] for key in steps}
        cpu: dict[str, list[float]] = {key: [] for key in steps}
        for _ in range(args.repeats):
            for key, run in steps.items():
                for _ in range(args.steps):
                    start, start_cpu = time.perf_counter(), time.process_time()
                    run(*batch)
                    wall[key].append(time.perf_counter() - start)
                    cpu[key].append(time.process_time() - start_cpu)
        del steps
        gc.collect()
        medians = {key: statistics.median(times) for key, times in wall.items()}
        for key, seconds in medians.items():
            versus = [
                f"{medians[ref] / seconds:.2f}x" if ref in medians else "-"
                for ref in ("float32", "float32-compiled")
            ]
            lines.append(
                f"| {name} | {work.samples} | {CONFIGS[key].label} | {seconds * 1e3:.0f} | "
                f"{statistics.median(cpu[key]):.2f} | {work.samples / seconds:.1f} | "
                f"{' | '.join(versus)} | {warm[key]:.1f} |"
            )
        rounds = {key: _round_medians(times, args.steps) for key, times in wall.items()}
        bars += [f"| {name} | {row} |" for row in train_bars(name, rounds)]
        results[name] = {"wall": wall, "cpu": cpu, "warm_up": warm, "batch": work.samples}
    return "\n".join(lines) + "\n\n" + "\n".join(bars), results


def _round_medians(times: list[float], steps: int) -> list[float]:
    """Each round's median step, from the steps in the order they ran."""
    return [statistics.median(times[i : i + steps]) for i in range(0, len(times), steps)]


def train_bars(name: str, rounds: dict[str, list[float]]) -> list[str]:
    """The issue's bars on training steps, each as ``bar | figure | target | met``, from each
    configuration's per-round median steps; a bar whose configurations were not run is left
    out. A figure is how many times as fast (above 1: faster)."""
    rows = []

    def bar(text: str, ours: str, theirs: str, target: float) -> None:
        if ours in rounds and theirs in rounds:
            figure = _ratio(rounds[theirs], rounds[ours])
            met = "met" if figure >= target else "NOT met"
            rows.append(f"{text} | {figure:.2f}x | {target:.2f}x | {met}")

    ran = [key for key in GRAPHAMP if key in rounds]
    if ran and "float32-compiled" in rounds:
        best = min(ran, key=lambda key: statistics.median(rounds[key]))
        target = BEST_BAR.get(name, 1.0)
        bar(f"graphamp's best step ({CONFIGS[best].label}) vs float32 compiled", best,
            "float32-compiled", target)  # fmt: skip
    bar("graphamp compiled vs graphamp eager", "graphamp-compiled", "graphamp", 1.0)
    bar("graphamp compiled vs compile + autocast", "graphamp-compiled", "compile+autocast", 1.0)
    bar("graphamp eager vs eager autocast", "graphamp", "autocast", 1.0)
    bar("graphamp, casts held, vs eager autocast", "graphamp-casts-held", "autocast", 1.0)
    bar("graphamp backend vs compile + autocast", "backend", "compile+autocast", 1.0)
    return rows


# -- memory ---------------------------------------------------------------------------------


def memory_part(args: argparse.Namespace) -> tuple[str, dict]:
    """Each configuration's peak in a fresh process (:func:`step_memory`)."""
    lines = [
        "| model | batch | configuration | state at the step's start MiB | peak MiB "
        "| peak vs float32 | step's own peak MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    bars = ["| model | bar | figure | target | met |", "|---|---|---|---|---|"]
    results: dict = {}
    for name in args.models:
        measured = {}
        for key in args.configs:
            command = [sys.executable, __file__, "--memory-of", name, key, "--scale", args.scale]
            command += ["--warmup", str(args.warmup)]
            if args.batch is not None:
                command += ["--batch", str(args.batch)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{' '.join(command)} failed: {done.stderr.strip()[-2000:]}")
            measured[key] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"  {name}: {key}: {measured[key]}", file=sys.stderr, flush=True)
        base = measured.get("float32")
        for key, figures in measured.items():
            peak = figures["state"] + figures["step"]
            versus = f"{peak / (base['state'] + base['step']):.2f}x" if base else "-"
            lines.append(
                f"| {name} | {figures['batch']} | {CONFIGS[key].label} | "
                f"{figures['state'] / 2**20:.0f} | {peak / 2**20:.0f} | {versus} | "
                f"{figures['step'] / 2**20:.0f} |"
            )
        if base:
            total = base["state"] + base["step"]
            for key in (k for k in GRAPHAMP if k in measured):
                figure = (measured[key]["state"] + measured[key]["step"]) / total
                met = "met" if figure <= 0.75 else "NOT met"
                bars.append(
                    f"| {name} | peak of one step, {CONFIGS[key].label}, vs float32 eager | "
                    f"{figure:.2f}x | at most 0.75x | {met} |"
                )
        results[name] = measured
    return "\n".join(lines) + "\n\n" + "\n".join(bars), results


def step_memory(args: argparse.Namespace, name: str, key: str) -> dict[str, int]:
    """Run in a fresh process: ``key``'s step of ``name`` warmed up, then the bytes of the
    tensors alive at the start of one step and the most that step allocates beyond them."""
    from torch._C._profiler import _EventType
    from torch.profiler import profile

    work = gpu_train.workload(name, args.scale, **_sizes(args, name))
    batch = work.batch(0, CPU)
    model = work.build(0).train()
    run = gpu_train.step_function(CONFIGS[key], work, model, CPU)
    for _ in range(args.warmup):
        run(*batch)
    for param in model.parameters():  # what the user's loop frees first (zero_grad)
        param.grad = None
    gc.collect()
    state = live_tensor_bytes()
    with profile(profile_memory=True) as profiled:
        run(*batch)
    events = profiled.profiler.kineto_results.experimental_event_tree()
    allocated = [
        event.extra_fields.total_allocated
        for event in _walk(events)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == CPU.type
    ]
    return {"state": state, "step": max(allocated, default=0), "batch": work.samples}


def _walk(events: list[Any]) -> Any:
    for event in events:
        yield event
        yield from _walk(event.children)


def live_tensor_bytes() -> int:
    """The bytes of the CPU storages of every tensor Python holds, each storage once."""
    seen: set[int] = set()
    total = 0
    for obj in gc.get_objects():
        if not isinstance(obj, torch.Tensor):
            continue
        try:  # a tensor without real storage (a wrapper, a capture's fake or functional one)
            storage = obj.untyped_storage()
            pointer = storage.data_ptr() if storage.device.type == "cpu" else 0
        except (RuntimeError, NotImplementedError):
            continue
        if pointer and pointer not in seen:
            seen.add(pointer)
            total += storage.nbytes()
    return total


# -- curves ---------------------------------------------------------------------------------


def curves_part(args: argparse.Namespace) -> tuple[str, dict]:
    lines = [
        f"| model | batch | input | steps | windows inside autocast's spread | a run's windows "
        "inside the band of the other autocast runs, autocast / graphamp | final loss, "
        f"autocast (min-max over {args.seeds} seeds) | final loss, graphamp | NaN/Inf losses, "
        "autocast / graphamp | steps graphamp skipped | seconds a curve, autocast / graphamp |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    results: dict = {}
    for name in args.models:
        sizes = _sizes(args, name, image=args.curve_image, seq=args.curve_seq)
        sizes["batch"] = args.curve_batch
        work = gpu_train.workload(name, args.scale, **sizes)
        runs = {
            key: [curve_run(args, name, key, work, seed) for seed in range(args.seeds)]
            for key in ("autocast", "graphamp")
        }
        curves = {key: [run.losses for run in done] for key, done in runs.items()}
        inside, count = gpu_train.within_spread(curves["graphamp"], curves["autocast"])
        held_out = gpu_train.held_out_inside(curves["graphamp"], curves["autocast"])
        held_cell = "-" if held_out is None else f"{held_out[1]:.0%} / {held_out[0]:.0%}"
        last = {k: [gpu_train.windows(c, 10)[-1] for c in v] for k, v in curves.items()}
        non_finite = {key: sum(run.non_finite for run in done) for key, done in runs.items()}
        skipped = [run.skipped for run in runs["graphamp"]]
        seconds = {
            key: statistics.median(run.seconds for run in done) for key, done in runs.items()
        }
        shape = f"{sizes['image']} px" if "image" in sizes else f"seq {sizes.get('seq')}"
        lines.append(
            f"| {name} | {work.samples} | {shape} | {args.curve_steps} | {inside}/{count} | "
            f"{held_cell} | "
            f"{min(last['autocast']):.4f}-{max(last['autocast']):.4f} | "
            f"{min(last['graphamp']):.4f}-{max(last['graphamp']):.4f} | "
            f"{non_finite['autocast']} / {non_finite['graphamp']} | "
            f"{'-' if None in skipped else sum(skipped)} | "
            f"{seconds['autocast']:.0f} / {seconds['graphamp']:.0f} |"
        )
        results[name] = {
            **curves,
            "inside": inside,
            "windows": count,
            "held_out": None
            if held_out is None
            else {"autocast": held_out[1], "graphamp": held_out[0]},
            "sizes": sizes,
            "non_finite": non_finite,
            "skipped": skipped,
            "seconds": {key: [run.seconds for run in done] for key, done in runs.items()},
        }
    return "\n".join(lines), results


def curve_run(
    args: argparse.Namespace, name: str, key: str, work: gpu_train.Workload, seed: int
) -> gpu_train.Curve:
    """One loss curve of configuration ``key``, a line on stderr every tenth of the way: a
    curve of a real model takes minutes, and a run of them an hour."""
    every = max(1, args.curve_steps // 10)

    def progress(done: int, seconds: float) -> None:
        if done % every == 0 or done == args.curve_steps:
            print(
                f"  curves: {name} {key} seed {seed}: {done}/{args.curve_steps} steps, "
                f"{seconds:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    return gpu_train.training_run(
        CONFIGS[key], work, seed, CPU, args.curve_steps, progress=progress
    )


# -- infer ----------------------------------------------------------------------------------


def infer_part(args: argparse.Namespace) -> tuple[str, dict]:
    return speedup_infer.run(
        args.models, args.scale, args.batches, args.runs, args.warmup, not args.no_compile
    )


# -- main -----------------------------------------------------------------------------------


def output_stem(part: str, models: list[str]) -> str:
    """The results' file name for ``part`` on ``models``: the part alone for every model, else
    the models after it, so runs of one model each (``--models resnet50``, then
    ``--models bert-base``) keep their own results in one ``--out``."""
    if sorted(models) == sorted(MODELS):
        return f"bench-speedup-{part}"
    return f"bench-speedup-{part}" + "".join(f"-{m}" for m in sorted(models))


PARTS = {"train": train_part, "memory": memory_part, "curves": curves_part, "infer": infer_part}
QUICK = {
    "scale": "tiny",
    "steps": 1,
    "repeats": 1,
    "warmup": 1,
    "curve_steps": 10,
    "seeds": 2,
    "batches": [1, 2],
    "runs": 1,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--part", choices=(*PARTS, "all"), default="all")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=tuple(CONFIGS),
        default=[key for key in CONFIGS if key != "graphamp-casts-held"],
        help="training configurations (train, memory); default: all but graphamp-casts-held "
        "(the eager train_step(recompute_casts=False): weights' casts held, as autocast does)",
    )
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="leave out every torch.compile configuration (training and inference)",
    )
    parser.add_argument("--batch", type=int, help="training batch (default 8; --quick 4)")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per round")
    parser.add_argument("--repeats", type=int, default=5, help="rounds over the configurations")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compiles)")
    parser.add_argument("--curve-steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=3, help="loss curves per configuration")
    parser.add_argument("--curve-batch", type=int, default=4)
    parser.add_argument("--curve-image", type=int, default=64, help="ResNet-50's curve input px")
    parser.add_argument("--curve-seq", type=int, default=64, help="BERT-base's curve sequence")
    parser.add_argument(
        "--batches",
        type=lambda text: [int(b) for b in text.split(",")],
        default=[1, 8, 32],
        help="inference batches, comma-separated (default 1,8,32)",
    )
    parser.add_argument("--runs", type=int, default=5, help="timed inference runs per round")
    parser.add_argument(
        "--quick", action="store_true", help="tiny models, one step of each: checks it runs"
    )
    parser.add_argument("--scale", choices=("cpu", "tiny"), default="cpu", help=argparse.SUPPRESS)
    parser.add_argument("--memory-of", nargs=2, metavar=("MODEL", "CONFIG"), help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=Path("speedup-results"))
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    for flag in ("steps", "repeats", "curve_steps", "seeds", "runs", "curve_batch"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.warmup < 1:
        parser.error("--warmup must be at least 1 (the first step captures and compiles)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.no_compile:
        args.configs = [key for key in args.configs if key in EAGER]
    warnings.filterwarnings("ignore")  # torch.compile and transformers warn on every model
    if args.memory_of:
        print(json.dumps(step_memory(args, *args.memory_of)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for part in PARTS if args.part == "all" else (args.part,):
        started = environment()
        table, results = PARTS[part](args)
        header = (
            f"Measured on: {started}; at the end: load average {os.getloadavg()[0]:.1f}, {memory()}"
        )
        text = f"## {part}\n\n{header}\n\n{table}\n"
        print(text, flush=True)
        stem = output_stem(part, args.models)
        (args.out / f"{stem}.md").write_text(text)
        (args.out / f"{stem}.json").write_text(
            json.dumps({"environment": header, "results": results}, indent=1, default=str)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
