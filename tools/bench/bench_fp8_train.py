"""Float8 training's loss curves: the zoo's GPT (small) trained in bfloat16, and with float8
current scaling (tensorwise, rowwise) and delayed scaling (Transformer Engine's default history
of 1024, and 16), from the same weights on the same batches; every 20-step mean loss against
bfloat16's, past step 20.

    python tools/bench/bench_fp8_train.py [--steps 500] [--json curves.json]

The data is a language the model can learn: token sequences from a fixed random Markov chain
over the vocabulary (each token followed by one of 4 likely successors), so the loss falls (from
about 22 at the zoo model's initialisation, far above ln(128) = 4.85) towards the chain's
entropy and a recipe that loses accuracy shows as a gap.
AdamW, lr 3e-3, batches of 8 x 16 tokens; every linear layer in float8 (``sizes="none"``: the
model is far under torchao's size table), the LM head kept (``keep_last``). Issue 41's bar: each
20-step mean within 2% of bfloat16's past step 20, no NaN, no skipped step. Timings are this
CPU's, which has no float8 arithmetic (``_scaled_mm`` is a reference kernel here): a float8
step is slower, not faster; tools/gpu/gpu_fp8.py measures speed on a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import machine

import graphamp
import graphamp.fx
from graphamp.models import build

VOCAB, BATCH, SEQ, WINDOW = 128, 8, 16, 20


def recipes() -> dict[str, graphamp.Float8 | None]:
    return {
        "bfloat16": None,
        "current tensorwise": graphamp.Float8.current(sizes="none"),
        "current rowwise": graphamp.Float8.current(granularity="row", sizes="none"),
        "delayed (history 1024)": graphamp.Float8.delayed(sizes="none"),
        "delayed (history 16)": graphamp.Float8.delayed(history=16, sizes="none"),
    }


def batches(steps: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches of a Markov chain's sequences: inputs and next tokens."""
    generator = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, VOCAB, (VOCAB, 4), generator=generator)
    weights = torch.tensor([0.55, 0.25, 0.15, 0.05])
    out = []
    for _ in range(steps):
        tokens = torch.empty(BATCH, SEQ + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=generator)
        for position in range(SEQ):
            pick = torch.multinomial(weights, BATCH, replacement=True, generator=generator)
            tokens[:, position + 1] = successors[tokens[:, position], pick]
        out.append((tokens[:, :-1], tokens[:, 1:]))
    return out


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def train(fp8: graphamp.Float8 | None, data: list) -> dict[str, object]:
    model, _ = build("gpt", "small")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step = graphamp.fx.train_step(model, loss_fn, optimizer, dtype="bfloat16", fp8=fp8)
    losses = [float(step(*data[0]))]  # the first call captures
    start = time.perf_counter()
    losses += [float(step(*batch)) for batch in data[1:]]
    seconds = (time.perf_counter() - start) / max(len(data) - 1, 1)
    chosen = sum(d.rule == "fp8" for d in step.plan.fp8.values()) if step.plan else 0
    return {
        "losses": losses,
        "skipped": int(step.skipped_steps),
        "nan": sum(not math.isfinite(x) for x in losses),
        "seconds_per_step": seconds,
        "float8_layers": chosen,
    }


def means(losses: list[float]) -> list[float]:
    return [
        sum(losses[i : i + WINDOW]) / WINDOW for i in range(0, len(losses) - WINDOW + 1, WINDOW)
    ]


def worst_gap(losses: list[float], reference: list[float]) -> tuple[float, int]:
    """The largest gap of a 20-step mean loss to the reference's, relative to the reference's,
    past the first window; and the first step of its window (0 when there is no such window)."""
    ours, theirs = means(losses), means(reference)
    gaps = [abs(m - r) / r for m, r in zip(ours[1:], theirs[1:], strict=True)]
    if not gaps:
        return 0.0, 0
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    return gaps[worst], WINDOW * (worst + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--json", type=Path, help="write every curve here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = batches(args.steps)
    print(f"# {machine()}; torch {torch.__version__}, {args.threads} thread(s)")
    print(f"# zoo GPT (small), {args.steps} AdamW steps, batch {BATCH} x {SEQ} tokens")
    runs = {name: train(fp8, data) for name, fp8 in recipes().items()}
    reference: list[float] = runs["bfloat16"]["losses"]  # type: ignore[assignment]
    header = "recipe                  layers  skipped  NaN  worst gap past step 20 (window)"
    print(f"{header}  last mean  ms/step")
    for name, run in runs.items():
        windows = means(run["losses"])  # type: ignore[arg-type]
        gap, first = worst_gap(run["losses"], reference)  # type: ignore[arg-type]
        shown = f"{gap:.2%} (steps {first}-{first + WINDOW - 1})" if first else "-"
        last = f"{windows[-1]:.4f}" if windows else "-"
        print(
            f"{name:<23} {run['float8_layers']:>6} {run['skipped']:>8} {run['nan']:>4}  "
            f"{shown:<32} {last:>9}  {1000 * run['seconds_per_step']:.1f}"  # type: ignore[operator]
        )
        run["window_means"], run["worst_gap"] = windows, gap
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
