"""Benchmark graphamp's PyTorch dialect against float32 and torch.autocast.

For the seeds' SimpleNet (3 x Linear with ReLU) and the BERT-style encoder, one
forward+backward step (loss = mean of squares of the output, in float32) is timed for:

* float32 eager,
* eager under ``torch.autocast`` (bfloat16, on the CPU),
* the graphamp module (``weights="master"``), eager,
* the graphamp module under ``torch.compile`` (inductor),

timed round-robin after one warm-up each (medians of ``--runs``), with the peak resident
memory of each (the kernel's high-water mark over its warm-up, reset before it) and, measured
in the same run, the bfloat16 matrix-product throughput, so each time can be read as a share
of the matmul roofline. Parameter memory with
``weights="low"`` against float32 closes the table.

Sizes: a CPU without bfloat16 instructions (no avx512_bf16/AMX) multiplies bfloat16 matrices
about 100x slower than float32, so a full-size step (SimpleNet 4096 x 512: 155 GFLOP) would take
minutes. The defaults are therefore SimpleNet 1024 wide at batch 64 and a 4-layer, 256-wide
BERT at batch 2 x 128 tokens; ``--width/--batch`` and ``--bert-hidden/--bert-layers/--bert-batch``
set others (4096/512 for the seeds' SimpleNet; 768/12 for BERT-base).

    python tools/bench/bench_fx.py
    python tools/bench/bench_fx.py --width 4096 --batch 512 --models simplenet
    python tools/bench/bench_fx.py --models bert --bert-hidden 768 --bert-layers 12 --bert-batch 1

``--suite models`` and ``--suite compile`` measure PyTorch models as users have them
(tools/bench/bench_fx_suites.py): Hugging Face BERT, LLaMA, Mistral, T5, ViT and a ResNet-50-shaped
CNN converted once and run at three batch sizes, saved and loaded (error and eager speed
against torch.autocast), and the torch.compile backend against torch.compile + autocast
(step time, loss curves against autocast + GradScaler).

    python tools/bench/bench_fx.py --suite models --batches 1,4,16
    python tools/bench/bench_fx.py --suite compile --steps 200
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import machine, median_time

HWM = Path("/proc/self/status")


def peak_rss_mb() -> float:
    for line in HWM.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> None:
    with contextlib.suppress(OSError):  # resets VmHWM on Linux; elsewhere peaks accumulate
        Path("/proc/self/clear_refs").write_text("5")


MATMULS = ("mm", "addmm", "bmm", "baddbmm")


class _RecordMatmuls(TorchDispatchMode):
    """Records every matrix product that runs: op, and shape/stride/dtype of each tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[object, list[object], dict[str, object]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func._opname in MATMULS:
            spec = [
                (tuple(a.shape), tuple(a.stride()), a.dtype) if isinstance(a, torch.Tensor) else a
                for a in args
            ]
            self.calls.append((func, spec, dict(kwargs or {})))
        return func(*args, **(kwargs or {}))


def matmul_floor(step: Callable[[], None], runs: int) -> tuple[float, float]:
    """(seconds, FLOPs) of exactly the matrix products ``step`` runs, replayed back to back
    with the same shapes, strides and dtypes: the floor under the step's time."""
    with _RecordMatmuls() as recorder:
        step()
    replay = []
    flops = 0.0
    for func, spec, kwargs in recorder.calls:
        args = [
            torch.empty_strided(a[0], a[1], dtype=a[2]).normal_()
            if isinstance(a, tuple) and len(a) == 3 and isinstance(a[2], torch.dtype)
            else a
            for a in spec
        ]
        replay.append((func, args, kwargs))
        out_shape = func(*args, **kwargs).shape
        left = args[0] if func._opname in ("mm", "bmm") else args[1]  # addmm(bias, a, b)
        inner = left.shape[-1]
        flops += 2 * float(torch.Size(out_shape).numel()) * inner
    # The recording step warmed the kernels: no untimed replay first (a full-size one is minutes).
    seconds, _ = median_time(lambda: [f(*a, **k) for f, a, k in replay], runs, warmup=0)
    return seconds, flops


def matmul_throughput(dtype: torch.dtype, m: int, k: int, n: int, runs: int = 5) -> float:
    """FLOP/s of an (m x k) @ (k x n) matrix product in ``dtype`` on this machine."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    seconds, _ = median_time(lambda: torch.mm(a, b), runs)
    return 2 * m * k * n / seconds


def step_flops(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> float:
    """FLOPs of forward+backward counted by torch's FlopCounterMode (matrix products)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        first(model(*inputs)).float().square().mean().backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def first(output: object) -> torch.Tensor:
    return output[0] if isinstance(output, tuple | list) else output  # type: ignore[return-value]


def build(name: str, args: argparse.Namespace) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from graphamp.models.simplenet import SimpleNet
    from graphamp.models.transformer import BertEncoder

    torch.manual_seed(0)
    if name == "simplenet":
        return SimpleNet(args.width), (torch.randn(args.batch, args.width),)
    hidden = args.bert_hidden
    model = BertEncoder(
        vocab=1000,
        hidden=hidden,
        layers=args.bert_layers,
        heads=hidden // 64,
        ffn=4 * hidden,
        seq=128,
    )
    shape = (args.bert_batch, 128)
    return model, (torch.randint(1, 1000, shape), torch.randint(0, 2, shape))


def gemm_shape(name: str, args: argparse.Namespace) -> tuple[int, int, int]:
    """(M, K, N) of the model's main matrix product, for the roofline."""
    if name == "simplenet":
        return args.batch, args.width, args.width
    return args.bert_batch * 128, args.bert_hidden, 4 * args.bert_hidden


def bench(name: str, args: argparse.Namespace, dtype: torch.dtype) -> list[dict[str, object]]:
    import graphamp.fx as gfx

    model, inputs = build(name, args)
    model.train()
    m, k, n = gemm_shape(name, args)
    runs = args.runs
    flops = step_flops(model, inputs)
    graphamp_module, _ = gfx.convert(model, inputs, dtype=str(dtype).removeprefix("torch."))
    compiled = torch.compile(graphamp_module)

    def step(module: torch.nn.Module, autocast: bool = False) -> Callable[[], None]:
        def run() -> None:
            with torch.autocast("cpu", dtype=dtype, enabled=autocast):
                out = first(module(*inputs))
            out.float().square().mean().backward()
            for p in module.parameters():
                p.grad = None

        return run

    floor_s, floor_flops = matmul_floor(step(model, True), runs)
    roofline = floor_flops / floor_s
    configs = [
        ("float32 eager", step(model)),
        ("torch.autocast eager", step(model, True)),
        ("graphamp eager", step(graphamp_module)),
        ("graphamp torch.compile", step(compiled)),
    ]
    # Warm each configuration once (compiling it), then time them round-robin, so that a
    # drift in the machine's speed over a long run falls on all of them alike.
    peaks, first_calls = {}, {}
    for label, fn in configs:
        reset_peak()
        before = peak_rss_mb()
        start = time.perf_counter()
        fn()
        first_calls[label] = time.perf_counter() - start
        peaks[label] = max(0.0, peak_rss_mb() - before)
    times: dict[str, list[float]] = {label: [] for label, _ in configs}
    for _ in range(runs):
        for label, fn in configs:
            start = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - start)
    rows = []
    for label, _ in configs:
        seconds = statistics.median(times[label])
        rows.append(
            {
                "model": name,
                "config": label,
                "step_s": seconds,
                "roofline": roofline,
                "roofline_share": flops / roofline / seconds,
                "peak_mb": peaks[label],
                "first_call_s": first_calls[label],
            }
        )
    low_model, _ = gfx.convert(
        model, inputs, weights="low", dtype=str(dtype).removeprefix("torch.")
    )
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    low_bytes = sum(p.numel() * p.element_size() for p in low_model.parameters())
    rows.append(
        {
            "model": name,
            "config": "parameters",
            "float32_mb": param_bytes / 2**20,
            "low_mb": low_bytes / 2**20,
            "flops": flops,
            "bf16_gflops": roofline / 1e9,
            "floor_s": floor_s,
            "fp32_gflops": matmul_throughput(torch.float32, m, k, n) / 1e9,
        }
    )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--suite",
        choices=("step", "models", "compile"),
        default="step",
        help="step: the training step below (default); models: HF models and a ResNet-50-"
        "shaped CNN as users have them; compile: the torch.compile backend",
    )
    parser.add_argument(
        "--models",
        default=None,
        help="step: simplenet,bert (default); models: bert,llama,mistral,t5,vit,resnet50",
    )
    parser.add_argument("--batches", default="1,4,16", help="models: three batch sizes")
    parser.add_argument("--hf-width", type=int, default=256, help="models: HF hidden size")
    parser.add_argument("--hf-layers", type=int, default=2, help="models: HF layers")
    parser.add_argument("--hf-seq", type=int, default=128, help="models: tokens per sequence")
    parser.add_argument("--image", type=int, default=64, help="models: ResNet image size")
    parser.add_argument("--steps", type=int, default=200, help="compile: training steps")
    parser.add_argument("--compile-width", type=int, default=64, help="compile: BERT width")
    parser.add_argument("--compile-batch", type=int, default=16, help="compile: batch size")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--width", type=int, default=1024, help="SimpleNet width (seeds: 4096)")
    parser.add_argument("--batch", type=int, default=64, help="SimpleNet batch (seeds: 512)")
    parser.add_argument(
        "--bert-hidden",
        type=int,
        default=256,
        help="BERT hidden size (BERT-base: 768; heads of 64, FFN 4x hidden)",
    )
    parser.add_argument("--bert-layers", type=int, default=4, help="BERT layers (BERT-base: 12)")
    parser.add_argument(
        "--bert-batch", type=int, default=2, help="BERT sequences of 128 tokens per batch"
    )
    args = parser.parse_args()
    dtype = torch.bfloat16
    torch.manual_seed(0)
    print(f"# graphamp PyTorch benchmark, {date.today().isoformat()}")
    print(f"machine: {machine()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    if args.suite != "step":
        import bench_fx_suites

        if args.suite == "compile":
            bench_fx_suites.bench_compile(args)
            return 0
        names = (args.models or "bert,llama,mistral,t5,vit,resnet50").split(",")
        bench_fx_suites.bench_models(names, [int(b) for b in args.batches.split(",")], args)
        return 0
    args.models = args.models or "simplenet,bert"
    print(
        f"sizes: SimpleNet {args.width} wide, batch {args.batch}; BERT {args.bert_layers} x "
        f"{args.bert_hidden}, batch {args.bert_batch} x 128 tokens"
    )
    print(
        "roofline share = time of the step's own matrix products (recorded from the autocast "
        "step, replayed in bfloat16 back to back in this run) / step time"
    )
    print()
    print(
        "| model | configuration | step s | speed vs autocast | share of bf16 matmul roofline | "
        "peak RSS MB | first call s |"
    )
    print("|---|---|---|---|---|---|---|")
    params = []
    for name in args.models.split(","):
        rows = bench(name, args, dtype)
        autocast = next(r["step_s"] for r in rows if r.get("config") == "torch.autocast eager")
        for row in rows:
            if row["config"] == "parameters":
                params.append(row)
                continue
            print(
                f"| {name} | {row['config']} | {row['step_s']:.3f} | "
                f"{autocast / row['step_s']:.2f}x | {row['roofline_share']:.0%} | "
                f"{row['peak_mb']:.0f} | {row['first_call_s']:.1f} |",
                flush=True,
            )
    print()
    print(
        '| model | float32 parameters MB | weights="low" MB | step GFLOP | matmul floor s | '
        "bf16 GFLOP/s of the step's matmuls | fp32 GFLOP/s, main GEMM |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in params:
        print(
            f"| {row['model']} | {row['float32_mb']:.1f} | {row['low_mb']:.1f} | "
            f"{row['flops'] / 1e9:.2f} | {row['floor_s']:.3f} | {row['bf16_gflops']:.1f} | "
            f"{row['fp32_gflops']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
