"""Training steps per second: float32 eager, eager torch.autocast (+ GradScaler where the dtype
needs scaling), and graphamp's whole-step graph, eager and under torch.compile.

    python tools/bench/bench_train.py [--runs 5]
    python tools/bench/bench_train.py --device cuda --width 4096 --batch 512   # the seeds' size,
    GPU

Models: the seeds' SimpleNet (3 x Linear with ReLU) and the MNIST CNN (conv, batch norm, max
pool, fc), SGD with momentum 0.9. On a CPU, bfloat16 (no loss scaling) and float16 with dynamic
loss scaling (GradScaler's behaviour: torch_defaults()). Sizes are small because this CPU has no
bfloat16/float16 arithmetic (see BENCHMARKS.md); `--width/--batch` change them.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import machine, median_time


def models(
    args: argparse.Namespace,
) -> list[tuple[str, nn.Module, tuple[torch.Tensor, ...], Callable]]:
    from graphamp.models.mnist import MnistCNN
    from graphamp.models.simplenet import SimpleNet

    torch.manual_seed(0)
    simple = (
        SimpleNet(args.width),
        (torch.randn(args.batch, args.width), torch.randn(args.batch, args.width)),
        nn.functional.mse_loss,
    )
    mnist = (
        MnistCNN(),
        (torch.randn(args.batch // 4, 1, 28, 28), torch.randint(0, 10, (args.batch // 4,))),
        nn.functional.nll_loss,
    )
    return [("simplenet", *simple), ("mnist", *mnist)]


def eager_step(
    model: nn.Module,
    loss_fn: Callable,
    batch: tuple[torch.Tensor, ...],
    dtype: torch.dtype | None,
    scaler: bool,
    device: str,
) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    grad_scaler = torch.amp.GradScaler(device) if scaler else None

    def run() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(model(*batch[:-1]).float(), batch[-1])
        if grad_scaler is None:
            loss.backward()
            optimizer.step()
        else:  # GradScaler reads found_inf on the host every step
            grad_scaler.scale(loss).backward()
            grad_scaler.step(optimizer)
            grad_scaler.update()

    return run


def main() -> int:
    from graphamp.fx import DynamicLossScaling, train_step

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--width", type=int, default=512, help="SimpleNet width (seeds: 4096)")
    parser.add_argument("--batch", type=int, default=64, help="SimpleNet batch; MNIST uses 1/4")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where to train; cuda also times each step to the end of its GPU work",
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here")
    sync = torch.cuda.synchronize if args.device == "cuda" else None
    device = torch.device(args.device)
    print(f"machine: {machine()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        f"sizes: SimpleNet {args.width} wide, batch {args.batch}; MNIST CNN batch "
        f"{args.batch // 4} x 28 x 28"
    )
    print()
    print("| model | configuration | steps/s | graphamp vs eager autocast |")
    print("|---|---|---|---|")
    for name, model, batch, loss_fn in models(args):
        model.to(device).train()
        batch = tuple(t.to(device) for t in batch)
        rows = [
            (
                "float32 eager",
                median_time(
                    eager_step(copy.deepcopy(model), loss_fn, batch, None, False, args.device),
                    args.runs,
                    warmup=2,
                    sync=sync,
                )[0],
            )
        ]
        for dtype, label, scaling in (
            (torch.bfloat16, "bfloat16", None),
            (torch.float16, "float16 + loss scaling", DynamicLossScaling.torch_defaults()),
        ):
            eager, _ = median_time(
                eager_step(
                    copy.deepcopy(model), loss_fn, batch, dtype, scaling is not None, args.device
                ),
                args.runs,
                warmup=2,
                sync=sync,
            )
            rows.append(
                (f"eager torch.autocast {label}" + (" + GradScaler" if scaling else ""), eager)
            )
            for compiled in (False, True):
                m = copy.deepcopy(model)
                step = train_step(
                    m,
                    loss_fn,
                    torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9),
                    dtype=str(dtype).removeprefix("torch."),
                    loss_scaling=scaling,
                )
                if compiled:
                    step.compile(*batch)
                seconds, _ = median_time(
                    lambda s=step, b=batch: s(*b), args.runs, warmup=2, sync=sync
                )
                rows.append(
                    (
                        f"graphamp step {label}" + (", torch.compile" if compiled else ""),
                        seconds,
                        eager,
                    )
                )
        for row in rows:
            ratio = f"{row[2] / row[1]:.2f}x" if len(row) > 2 else ""
            print(f"| {name} | {row[0]} | {1 / row[1]:.2f} | {ratio} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
