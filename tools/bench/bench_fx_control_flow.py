"""torch.cond, torch.while_loop and torch.map modules: graphamp against torch.autocast.

For each module of ``graphamp.models.torch_control_flow`` and each low type (bfloat16 and
float16, on the CPU), on the same inputs:

* the error of graphamp's converted module against the float32 module (max abs error, the
  same relative to max |y|, NaN/Inf count) and torch.autocast's (on the same device), and
  their ratio: the issue's figure is graphamp's error > 0 (the bodies are converted: before,
  a cond ran its branches in float32, error exactly 0) and at most 1.25x autocast's;
* where the casts of the converted module run: once per call (the main graph, a cond's
  branch) or once per iteration (a loop body);
* forward times (medians after a warm-up, round-robin): float32 eager, autocast eager, the
  converted module eager. On a CPU without bfloat16/float16 matrix units (see the machine
  line) the low types are emulated and slower than float32: the times say what the casts
  cost beside the same emulated matrix products, not what a GPU gains.

Autocast cannot run every such module: a while_loop whose body gives the carried state in
another type than it was given is refused by torch ("same metadata"); the table says so.

    python tools/bench/bench_fx_control_flow.py
    python tools/bench/bench_fx_control_flow.py --width 256 --runs 20
    python tools/bench/bench_fx_control_flow.py --runs 0      # errors and casts only, no timing
"""

from __future__ import annotations

import argparse
import sys
import warnings
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import machine, median_time

import graphamp.fx as gfx
from graphamp.models.torch_control_flow import CASES

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
LIMIT = 1.25


def errors(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float, int]:
    got = got.float()
    bad = int((~torch.isfinite(got)).sum())
    error = float((got - want).abs().max())
    return error, error / float(want.abs().max()), bad


def cast_sites(module: torch.fx.GraphModule) -> tuple[int, int]:
    """(casts run once per call, casts run once per iteration of a loop body)."""
    once, per_iteration = 0, 0
    loops = {
        str(node.args[1].target)
        for sub in module.modules()
        if isinstance(sub, torch.fx.GraphModule)
        for node in sub.graph.nodes
        if node.target is torch.ops.higher_order.while_loop
    } | {
        str(node.args[0].target)
        for sub in module.modules()
        if isinstance(sub, torch.fx.GraphModule)
        for node in sub.graph.nodes
        if node.target is torch.ops.higher_order.map_impl
    }
    for name, sub in module.named_modules():
        if not isinstance(sub, torch.fx.GraphModule):
            continue
        count = sum(n.target is torch.ops.aten._to_copy.default for n in sub.graph.nodes)
        in_loop = any(part in loops for part in name.split("."))
        if in_loop:
            per_iteration += count
        else:
            once += count
    return once, per_iteration


def run(name: str, dtype: str, width: int, runs: int) -> dict[str, object]:
    torch.manual_seed(0)
    model, inputs = CASES[name](width)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no native low-precision matrix units: a warning
        converted, _ = gfx.convert(model, (inputs[0],), device="cpu", dtype=dtype)
    row: dict[str, object] = {"model": name, "dtype": dtype, "casts": cast_sites(converted)}
    ours, theirs, refused = [], [], ""
    with torch.no_grad():
        for x in inputs:
            want = model(x)
            ours.append(errors(converted(x), want))
            try:
                with torch.autocast("cpu", dtype=DTYPES[dtype]):
                    theirs.append(errors(model(x), want))
            except Exception as error:  # torch refuses some loops: reported, not hidden
                refused = str(error).strip().splitlines()[0][:60]
    row["graphamp"] = max(ours)
    row["autocast"] = max(theirs) if theirs and not refused else None
    row["refused"] = refused
    x = inputs[0]

    def autocast_forward() -> torch.Tensor:
        with torch.autocast("cpu", dtype=DTYPES[dtype]):
            return model(x)

    if not runs:
        row["ms"] = {}
        return row
    candidates = {"float32": lambda: model(x), "graphamp": lambda: converted(x)}
    if not refused:
        candidates["autocast"] = autocast_forward
    times = {key: [] for key in candidates}
    with torch.no_grad():
        for _ in range(3):  # round-robin: the machine's load falls on each alike
            for key, fn in candidates.items():
                times[key].append(median_time(fn, max(1, runs // 3))[0])
    row["ms"] = {key: 1000 * sorted(values)[len(values) // 2] for key, values in times.items()}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=64, help="hidden width (default 64)")
    parser.add_argument(
        "--runs", type=int, default=9, help="timed calls per variant (0: errors and casts only)"
    )
    parser.add_argument("--models", nargs="*", default=list(CASES), choices=list(CASES))
    args = parser.parse_args(argv)
    print(f"# bench_fx_control_flow, {date.today()}, torch {torch.__version__}")
    print(f"# machine: {machine()}")
    print(
        f"# command: python tools/bench/bench_fx_control_flow.py {' '.join(argv or sys.argv[1:])}"
    )
    print(
        "| module | dtype | graphamp max err (rel) | autocast max err (rel) | ratio | "
        "figure | casts per call / per iteration | ms float32 / autocast / graphamp |"
    )
    print("|---|---|---|---|---|---|---|---|")
    failed = False
    for name in args.models:
        for dtype in DTYPES:
            row = run(name, dtype, args.width, args.runs)
            ours = row["graphamp"]
            theirs = row["autocast"]
            assert isinstance(ours, tuple)
            mine = f"{ours[0]:.2e} ({ours[1]:.2e}){' NaN/Inf' if ours[2] else ''}"
            if theirs is None:
                other, ratio = f"refuses: {row['refused']}", "-"
                ok = ours[0] > 0 and not ours[2]
            else:
                assert isinstance(theirs, tuple)
                other = f"{theirs[0]:.2e} ({theirs[1]:.2e})"
                ratio = f"{ours[0] / theirs[0]:.2f}x" if theirs[0] else "-"
                ok = 0 < ours[0] <= LIMIT * theirs[0] and not ours[2]
            failed |= not ok
            once, per_iteration = row["casts"]  # type: ignore[misc]
            ms = row["ms"]
            assert isinstance(ms, dict)
            variants = ("float32", "autocast", "graphamp")
            timing = " / ".join(f"{ms[key]:.3f}" if key in ms else "-" for key in variants)
            print(
                f"| {name} | {dtype} | {mine} | {other} | {ratio} | "
                f"{'ok' if ok else 'MISSED'} | {once} / {per_iteration} | {timing} |"
            )
    print(f"# figure: graphamp error > 0 and <= {LIMIT}x autocast's where autocast runs")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
