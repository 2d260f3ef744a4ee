"""Float8 on a GPU (issue 41): what float8 products and a float8 training step gain over
bfloat16, and graphamp's step against torchao's.

    python tools/gpu/gpu_fp8.py [--json out.json]        # on a machine with a CUDA device
    python tools/gpu/gpu_fp8.py --dry-run                # the same code, tiny shapes, CPU

1. **GEMMs**: ``torch._scaled_mm`` (E4M3 x E4M3 -> bfloat16, per-tensor and per-row scales,
   fast accumulation) against the bfloat16 product, in TFLOP/s, at 4096^3, 8192^3 and
   LLaMA-3-8B's shapes (M = 8192 tokens: the attention projections 4096 -> 4096 and 4096 ->
   1024, SwiGLU's 4096 -> 14336 and 14336 -> 4096).
2. **One LLaMA-3-8B decoder block** (hidden 4096, 32 query and 8 key/value heads, SwiGLU
   14336, RMSNorm, causal attention; a batch of 2 x 4096 tokens), a whole training step
   (forward, backward, an SGD update) under ``torch.compile``: bfloat16 (graphamp's step;
   autocast), graphamp float8 (current tensorwise and rowwise, delayed) and
   torchao's ``Float8Linear`` (tensorwise, rowwise) on the same layers (the ones graphamp's
   float8 rules chose: torchao's size table keeps the 4096 -> 1024 key/value projections
   out). The issue's bar: graphamp float8 at least 1.2x bfloat16 and at least 0.95x torchao.

Times are medians of ``--runs`` after ``--warmup`` calls, the device synchronised around each;
the card is named first. ``--dry-run`` runs every configuration at tiny sizes on the CPU,
eagerly unless ``--compile`` (tests/tools/test_gpu_fp8.py): its figures are not speed figures.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

# (label, M, K, N) of the GEMMs; tiny ones for a dry run
GEMMS = {
    "full": [
        ("4096^3", 4096, 4096, 4096),
        ("8192^3", 8192, 8192, 8192),
        ("LLaMA-3-8B q/o proj", 8192, 4096, 4096),
        ("LLaMA-3-8B k/v proj", 8192, 4096, 1024),
        ("LLaMA-3-8B gate/up", 8192, 4096, 14336),
        ("LLaMA-3-8B down", 8192, 14336, 4096),
    ],
    "tiny": [("64^3", 64, 64, 64), ("tiny up", 32, 64, 128), ("tiny down", 32, 128, 64)],
}
BLOCKS = {
    "full": {"hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "batch": 2, "seq": 4096},
    "tiny": {"hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "batch": 2, "seq": 16},
}


class RMSNorm(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
        return (x.float() * rms).to(x.dtype) * self.weight


class DecoderBlock(nn.Module):
    """LLaMA-3's decoder block (no rotary embedding: it moves no matrix product)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int, **_: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.attention_norm, self.mlp_norm = RMSNorm(hidden), RMSNorm(hidden)
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        h = self.attention_norm(x)

        def heads(t: torch.Tensor, count: int) -> torch.Tensor:
            return t.view(batch, seq, count, self.head_dim).transpose(1, 2)

        q, k, v = (
            heads(self.q(h), self.heads),
            heads(self.k(h), self.kv_heads),
            heads(self.v(h), self.kv_heads),
        )
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attended.transpose(1, 2).reshape(batch, seq, hidden))
        h = self.mlp_norm(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


def timed(fn: Callable[[], Any], device: str, runs: int, warmup: int) -> float:
    """Median seconds of ``runs`` calls of ``fn`` after ``warmup``."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# -- 1. GEMMs --------------------------------------------------------------------------------


def gemm_rows(size: str, device: str, runs: int, warmup: int) -> list[dict[str, Any]]:
    rows = []
    for label, m, k, n in GEMMS[size]:
        seconds = _gemm_seconds(m, k, n, device, runs, warmup)
        flops = 2.0 * m * k * n
        row: dict[str, Any] = {"gemm": label, "M": m, "K": k, "N": n}
        row.update({f"{name} TFLOP/s": flops / s / 1e12 for name, s in seconds.items()})
        row["per tensor vs bfloat16"] = seconds["bfloat16"] / seconds["float8 per tensor"]
        row["per row vs bfloat16"] = seconds["bfloat16"] / seconds["float8 per row"]
        rows.append(row)
    return rows


def _gemm_seconds(m: int, k: int, n: int, device: str, runs: int, warmup: int) -> dict[str, float]:
    """The bfloat16 product and the float8 ones (E4M3 x E4M3 -> bfloat16, fast accumulation,
    B column-major: the TN layout) of an M x K and a K x N matrix."""
    a, b = torch.randn(m, k, device=device), torch.randn(n, k, device=device)
    a16, b16 = a.bfloat16(), b.bfloat16()
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=device)
    rows_a, rows_b = torch.ones(m, 1, device=device), torch.ones(1, n, device=device)

    def scaled(scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(
            a8, b8, scale_a, scale_b, out_dtype=torch.bfloat16, use_fast_accum=True
        )

    cases = {
        "bfloat16": lambda: a16 @ b16.t(),
        "float8 per tensor": lambda: scaled(one, one),
        "float8 per row": lambda: scaled(rows_a, rows_b),
    }
    return {name: timed(fn, device, runs, warmup) for name, fn in cases.items()}


# -- 2. one decoder block, a whole training step ----------------------------------------------


def block_rows(
    size: str, device: str, runs: int, warmup: int, compile_steps: bool
) -> list[dict[str, Any]]:
    import graphamp
    import graphamp.fx

    shape = BLOCKS[size]
    torch.manual_seed(0)
    block = DecoderBlock(**shape).to(device)
    x = torch.randn(shape["batch"], shape["seq"], shape["hidden"], device=device)
    target = torch.randn_like(x)
    # torchao's size table decides (tiny layers are all under it); a lone block's last
    # product is no LM head, so keep_last is off
    shared = {"sizes": "none" if size == "tiny" else "torchao", "keep_last": False}
    recipes = {
        "graphamp bfloat16": None,
        "graphamp float8 current tensorwise": graphamp.Float8.current(**shared),
        "graphamp float8 current rowwise": graphamp.Float8.current("row", **shared),
        "graphamp float8 delayed": graphamp.Float8.delayed(**shared),
    }
    rows: list[dict[str, Any]] = []
    chosen: set[str] = set()
    for name, fp8 in recipes.items():
        model = copy.deepcopy(block)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        step = graphamp.fx.train_step(
            model, nn.functional.mse_loss, optimizer, dtype="bfloat16", fp8=fp8
        )
        started = time.perf_counter()
        if compile_steps:
            step.compile(x, target)
        step(x, target)  # captures (and compiles)
        ready = time.perf_counter() - started
        seconds = timed(lambda s=step: s(x, target), device, runs, warmup)
        layers = sorted(n for n, d in step.plan.fp8.items() if d.rule == "fp8") if fp8 else []
        chosen |= {_module_of(layer) for layer in layers}
        rows.append(_row(name, len(layers), seconds, ready))
        del model, optimizer, step
    for name, recipe in (
        ("autocast bfloat16", None),
        ("torchao Float8Linear tensorwise", "tensorwise"),
        ("torchao Float8Linear rowwise", "rowwise"),
    ):
        seconds, layers, ready = _eager_step(
            block, x, target, recipe, chosen, device, compile_steps, (runs, warmup)
        )
        rows.append(_row(name, layers, seconds, ready))
    _compiled_label(rows, compile_steps)
    base = next(r["seconds"] for r in rows if r["configuration"] == "graphamp bfloat16")
    for row in rows:
        row["vs graphamp bfloat16"] = base / row["seconds"]
    return rows


def _row(name: str, layers: int, seconds: float, ready: float) -> dict[str, Any]:
    """One configuration's figures, printed as soon as they are known (a run cut short by a
    time limit keeps what it measured)."""
    print(f"  {name}: {layers} float8 layers, {seconds * 1e3:.2f} ms a step, ready in "
          f"{ready:.0f} s", flush=True)  # fmt: skip
    return {"configuration": name, "float8 layers": layers, "seconds": seconds, "ready s": ready}


def _compiled_label(rows: list[dict[str, Any]], compiled: bool) -> None:
    for row in rows:
        row["compiled"] = "yes" if compiled else "no"


def _module_of(layer: str) -> str:
    """The module path of a plan's layer node (``q/linear`` -> ``q``)."""
    return layer.rsplit("/", 1)[0]


def _eager_step(
    block: nn.Module,
    x: torch.Tensor,
    target: torch.Tensor,
    recipe: str | None,
    chosen: set[str],
    device: str,
    compile_steps: bool,
    counts: tuple[int, int],
) -> tuple[float, int, float]:
    """A step of autocast bfloat16 with, for a torchao recipe, Float8Linear in place of the
    layers graphamp chose: the time, the number of float8 layers, the seconds to the first
    step's end (compiling)."""
    model = copy.deepcopy(block)
    layers = 0
    if recipe is not None:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig.from_recipe_name(recipe)
        convert_to_float8_training(
            model, config=config, module_filter_fn=lambda _, fqn: fqn in chosen
        )
        layers = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    forward = torch.compile(model) if compile_steps else model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    autocast_device = "cuda" if device == "cuda" else "cpu"

    def step() -> None:
        with torch.autocast(autocast_device, dtype=torch.bfloat16):
            out = forward(x)
        nn.functional.mse_loss(out.float(), target).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    started = time.perf_counter()
    step()
    ready = time.perf_counter() - started
    return timed(step, device, *counts), layers, ready


# -- the report ------------------------------------------------------------------------------


def markdown(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--compile", action="store_true", help="compile in a dry run too")
    parser.add_argument("--runs", type=int, default=None, help="timed calls (default 20; 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls (5; 1)")
    parser.add_argument("--part", choices=["gemm", "block", "all"], default="all")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.dry_run:
        device, size, compile_steps = "cpu", "tiny", args.compile
    elif torch.cuda.is_available():
        device, size, compile_steps = "cuda", "full", True
    else:
        print("gpu_fp8: torch sees no CUDA device (--dry-run runs it on the CPU)", file=sys.stderr)
        return 2
    runs = args.runs or (2 if args.dry_run else 20)
    warmup = args.warmup or (1 if args.dry_run else 5)
    card = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (dry run: no speed figure)"
    print(f"# gpu_fp8 on {card}; torch {torch.__version__}")
    results: dict[str, Any] = {"device": card, "torch": torch.__version__}
    if args.part in ("gemm", "all"):
        results["gemms"] = gemm_rows(size, device, runs, warmup)
        print("## Float8 GEMMs against bfloat16\n" + markdown(results["gemms"]))
    if args.part in ("block", "all"):
        results["block"] = block_rows(size, device, runs, warmup, compile_steps)
        print("## One LLaMA-3-8B decoder block, a training step\n" + markdown(results["block"]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
