"""What mixed precision is for, measured on the GPU this runs on: training speed-up over
float32 and inference latency against onnxruntime's float16 tool.

    python tools/gpu/bench_gpu.py [--part train|curves|infer|all] [--models NAME ...] [--out DIR]
    python tools/gpu/bench_gpu.py --part train --models bert-base --profile --out gpu-results

**Training** (``--part train``): one whole step (forward, loss, backward, optimizer update,
and for float16 the loss scaling, unscale, finite check, step guard and scale update) of a
ResNet-50 (batch 128, 224x224, SGD with momentum) and Hugging Face BERT-base (masked-LM loss,
batch 32, sequence 512, AdamW), random weights and data: float32 with TF32 off (and on, beside
it), eager ``torch.autocast`` (+ ``GradScaler`` for float16), ``torch.compile`` + autocast, and
``graphamp.fx.train_step`` eager and compiled, in float16 and bfloat16. Per configuration: the
median step after a warm-up, the allocator's peak memory, samples/s, and the speed-up over
float32, eager autocast and compile + autocast at the same type. The peak is the allocator's
over the timed steps (the model, its optimizer state and what a step allocates); the warm-up's
(graphamp's capture, torch.compile's compilation, the first optimizer state) is beside it.
**Loss curves** (``--part curves``): ``--curve-steps`` steps (200) of autocast + GradScaler and
of graphamp's step in float16, each from ``--seeds`` (3) initialisations and data sets of 8
batches; graphamp's curves should lie inside the seed-to-seed spread of autocast's (windows of
10 steps).
**Inference** (``--part infer``): BERT-base (batch 8 x 128), a GPT-2 decoding step with its
key/value cache (batch 8, 128 cached positions), a LLaMA-shaped decoder at opset 18
(TinyLlama's shapes, 128 tokens) and the zoo's ResNet-50 (batch 8), each converted by graphamp
and by onnxruntime's float16 tool, float32 inputs and outputs kept by both, run on
onnxruntime's CUDA provider with the inputs and outputs bound on the GPU.
``--profile`` adds, wherever graphamp is slower than a baseline, where both spend their time
(torch.profiler or onnxruntime's profiler) in ``OUT/profile-*.txt``. ``--extra-modes`` adds
float32 compiled and the graphamp backend in the user's loop to the training part;
``--deadline`` (seconds since the epoch) starts no configuration, curve or model after it and
names in the table what it left (``tools/gpu_check.sh`` gives each part its share of a budget).

Without a GPU the same code runs on the CPU at tiny sizes (a test keeps it working); those
figures say nothing about speed. Results: Markdown on stdout and in
``OUT/bench-gpu-<part>[-<model>...].md``, JSON beside it, with the GPU's name, the driver,
torch and onnxruntime versions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# graphamp itself comes installed (or staged: tools/gpu_check.sh), never from ROOT, whose
# graphamp/ lacks the passes/ and models/ that installing maps into it
sys.path[:0] = [str(ROOT / "tools" / "gpu"), str(ROOT / "tools" / "bench")]

import gpu_infer  # noqa: E402
import gpu_train  # noqa: E402
import torch  # noqa: E402
from benchlib import machine  # noqa: E402


def environment(device: torch.device) -> str:
    """The GPU, driver, CUDA, torch and onnxruntime versions (and the CPU)."""
    import onnxruntime

    parts = [f"torch {torch.__version__}", f"onnxruntime {onnxruntime.__version__}"]
    if device.type == "cuda":
        try:
            driver = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            driver = "unknown"
        parts[:0] = [
            f"GPU {torch.cuda.get_device_name(device)}",
            f"driver {driver}",
            f"CUDA {torch.version.cuda}",
        ]
    else:
        parts[:0] = ["no GPU: tiny sizes on the CPU, not a speed figure"]
    return f"{', '.join(parts)}; host: {machine()}; {date.today().isoformat()}"


def _ratio(base: float | None, ours: float) -> str:
    return f"{base / ours:.2f}x" if base else ""


def out_of_time(args: argparse.Namespace, what: str, skipped: list[str]) -> bool:
    """Whether ``--deadline`` has passed: then ``what`` is not started, and is named in
    ``skipped`` (the table says so)."""
    if args.deadline is None or time.time() < args.deadline:
        return False
    skipped.append(what)
    print(f"  {what}: skipped, past --deadline", file=sys.stderr, flush=True)
    return True


def _skipped_note(skipped: list[str]) -> str:
    return (
        f"\n\nNot measured, past the time budget (--deadline): {', '.join(skipped)}."
        if skipped
        else ""
    )


def train_part(args: argparse.Namespace, device: torch.device, scale: str) -> tuple[str, dict]:
    lines = [
        "| model | configuration | median step ms | peak GiB | samples/s | vs float32 "
        "| vs eager autocast | vs compile + autocast | vs float32 compiled "
        "| warm-up peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    results: dict = {}
    skipped: list[str] = []
    for name in args.models_train:
        work = gpu_train.workload(name, scale)
        base = work.build(0)
        timings = {}
        for mode in gpu_train.modes(tuple(args.dtypes), not args.no_compile, args.extra_modes):
            if out_of_time(args, f"{name} {mode.label}", skipped):
                continue
            timing = gpu_train.time_mode(mode, work, base, device, args.steps, args.warmup)
            timings[mode] = timing
            print(f"  {name}: {mode.label}: {timing.seconds * 1e3:.2f} ms", file=sys.stderr)
        if gpu_train.Mode("float32") not in timings:
            continue
        fp32 = timings[gpu_train.Mode("float32")].seconds
        fp32_compiled = timings.get(gpu_train.Mode("float32", compiled=True))
        rows = []
        for mode, timing in timings.items():
            eager = timings.get(gpu_train.Mode("autocast", mode.dtype))
            compiled = timings.get(gpu_train.Mode("compile+autocast", mode.dtype))
            ours = mode.kind in ("graphamp", "backend")
            peak, warmup_peak = (
                f"{value / 2**30:.2f}" if value else "-"
                for value in (timing.peak_bytes, timing.warmup_peak_bytes)
            )
            lines.append(
                f"| {name} | {mode.label} | {timing.seconds * 1e3:.2f} | {peak} | "
                f"{timing.samples_per_s:.1f} | {_ratio(fp32, timing.seconds)} | "
                f"{_ratio(eager.seconds if eager and ours else None, timing.seconds)} | "
                f"{_ratio(compiled.seconds if compiled and ours else None, timing.seconds)} | "
                f"{_ratio(fp32_compiled.seconds if fp32_compiled else None, timing.seconds)} | "
                f"{warmup_peak} |"
            )
            rows.append(
                {
                    "mode": mode.label,
                    "seconds": timing.seconds,
                    "all_seconds": timing.all_seconds,
                    "peak_bytes": timing.peak_bytes,
                    "warmup_peak_bytes": timing.warmup_peak_bytes,
                    "samples_per_s": timing.samples_per_s,
                }
            )
            slower = [b for b in (eager, compiled) if ours and b and b.seconds < timing.seconds]
            if args.profile and slower:
                text = "\n\n".join(
                    gpu_train.profile(m, work, base, device) for m in (mode, slower[0].mode)
                )
                slug = mode.label.replace(" ", "_").replace(",", "")
                (args.out / f"profile-{name}-{slug}.txt").write_text(text)
        results[name] = rows
    return "\n".join(lines) + _skipped_note(skipped), results


def curves_part(args: argparse.Namespace, device: torch.device, scale: str) -> tuple[str, dict]:
    lines = [
        f"| model | dtype | windows inside autocast's spread | final loss, autocast "
        f"(min-max over {args.seeds} seeds) | final loss, graphamp |",
        "|---|---|---|---|---|",
    ]
    results: dict = {}
    skipped: list[str] = []
    for name in args.models_train:
        sizes = {"batch": args.curve_batch} if args.curve_batch else {}
        work = gpu_train.workload(name, scale, **sizes)
        for dtype in args.dtypes:
            if out_of_time(args, f"{name} {dtype} curves", skipped):
                continue
            theirs = [
                gpu_train.loss_curve(
                    gpu_train.Mode("autocast", dtype), work, s, device, args.curve_steps
                )
                for s in range(args.seeds)
            ]
            ours = [
                gpu_train.loss_curve(
                    gpu_train.Mode("graphamp", dtype), work, s, device, args.curve_steps
                )
                for s in range(args.seeds)
            ]
            inside, count = gpu_train.within_spread(ours, theirs)
            last = [gpu_train.windows(c, 10)[-1] for c in theirs]
            mine = [gpu_train.windows(c, 10)[-1] for c in ours]
            lines.append(
                f"| {name} | {dtype} | {inside}/{count} | {min(last):.4f}-{max(last):.4f} | "
                f"{min(mine):.4f}-{max(mine):.4f} |"
            )
            results[f"{name}/{dtype}"] = {
                "autocast": theirs,
                "graphamp": ours,
                "inside": inside,
                "windows": count,
            }
    return "\n".join(lines) + _skipped_note(skipped), results


def infer_part(args: argparse.Namespace, device: torch.device, scale: str) -> tuple[str, dict]:
    where = "cuda" if device.type == "cuda" else "cpu"
    lines = [
        "| model | model as | Casts | median latency ms | vs float32 | graphamp vs the tool |",
        "|---|---|---|---|---|---|",
    ]
    results: dict = {}
    skipped: list[str] = []
    for name in args.models_infer:
        if out_of_time(args, f"{name} inference", skipped):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            source, feeds = gpu_infer.build(name, scale, folder)
            paths = {
                "float32": source,
                "graphamp": folder / "graphamp.onnx",
                "onnxruntime float16": folder / "ort.onnx",
            }
            gpu_infer.convert_graphamp(source, paths["graphamp"])
            gpu_infer.convert_ort(source, paths["onnxruntime float16"])
            seconds = {
                tool: gpu_infer.latency(path, feeds, where, args.infer_runs, args.infer_warmup)
                for tool, path in paths.items()
            }
            counts = {tool: gpu_infer.casts(path) for tool, path in paths.items()}
            for tool, value in seconds.items():
                versus = _ratio(seconds["onnxruntime float16"], value) if tool == "graphamp" else ""
                lines.append(
                    f"| {name} | {tool} | {counts[tool]} | {value * 1e3:.3f} | "
                    f"{_ratio(seconds['float32'], value)} | {versus} |"
                )
            if args.profile and seconds["graphamp"] > seconds["onnxruntime float16"]:
                text = "\n\n".join(
                    f"{tool}:\n{gpu_infer.profile(paths[tool], feeds, where)}"
                    for tool in ("graphamp", "onnxruntime float16")
                )
                (args.out / f"profile-{name}-inference.txt").write_text(text)
            results[name] = {"seconds": seconds, "casts": counts}
            print(f"  {name}: {seconds}", file=sys.stderr)
    return "\n".join(lines) + _skipped_note(skipped), results


PARTS = {"train": train_part, "curves": curves_part, "infer": infer_part}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--part", choices=(*PARTS, "all"), default="all")
    parser.add_argument(
        "--models",
        nargs="+",
        choices=sorted({*gpu_train.WORKLOADS, *gpu_infer.MODELS}),
        help="only these (training: resnet50, bert-base; inference: also gpt2-kv, "
        "llama-decoder); default: every model of the part",
    )
    parser.add_argument(
        "--dtypes", nargs="+", choices=("float16", "bfloat16"), default=["float16", "bfloat16"]
    )
    parser.add_argument("--steps", type=int, default=20, help="timed training steps (median)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--curve-steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--infer-runs", type=int, default=100)
    parser.add_argument("--infer-warmup", type=int, default=20)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile modes")
    parser.add_argument(
        "--extra-modes",
        action="store_true",
        help="also float32 compiled and the graphamp backend in the user's loop (training)",
    )
    parser.add_argument(
        "--curve-batch", type=int, help="the loss curves' batch (default: the training batch)"
    )
    parser.add_argument(
        "--deadline",
        type=float,
        help="a time (seconds since the epoch) after which no configuration, curve or model "
        "starts; what is left is named as not measured",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile graphamp and the baseline wherever graphamp is slower",
    )
    parser.add_argument("--tiny", action="store_true", help="tiny sizes even on a GPU")
    parser.add_argument("--out", type=Path, default=Path("gpu-results"))
    args = parser.parse_args(argv)
    for flag in ("steps", "warmup", "curve_steps", "seeds", "infer_runs"):
        if getattr(args, flag) < 1 and not (flag == "warmup" and args.warmup == 0):
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    chosen = set(args.models or [*gpu_train.WORKLOADS, *gpu_infer.MODELS])
    args.models_train = [m for m in gpu_train.WORKLOADS if m in chosen]
    args.models_infer = [m for m in gpu_infer.MODELS if m in chosen]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    scale = "full" if device.type == "cuda" and not args.tiny else "tiny"
    args.out.mkdir(parents=True, exist_ok=True)
    header = f"Measured on: {environment(device)}; sizes: {scale}"
    print(header)
    for part in PARTS if args.part == "all" else (args.part,):
        table, results = PARTS[part](args, device, scale)
        text = f"## {part}\n\n{header}\n\n{table}\n"
        print(text, flush=True)
        stem = f"bench-gpu-{part}" + "".join(f"-{m}" for m in sorted(args.models or []))
        (args.out / f"{stem}.md").write_text(text)
        (args.out / f"{stem}.json").write_text(
            json.dumps({"environment": header, "results": results}, indent=1, default=str)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
