"""Benchmark the plan commands: `graphamp plan` on the full-size BERT-style model, and a diff of
two plans of a 50,000-node graph that differ in one node.

    python tools/bench/bench_plan.py [--runs 5] [--nodes 50000]

Times are medians of --runs after one warm-up, in one process after import (the figure the
issue sets), with the whole command's wall time (Python start and imports included) beside.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_onnx import chain_model
from benchlib import machine, median_time


def wall(command: list[str], runs: int) -> float:
    return median_time(lambda: subprocess.run(command, check=True, capture_output=True), runs)[0]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=50_000)
    args = parser.parse_args()

    import onnx

    import graphamp.onnx as gonnx
    from graphamp.models import export_onnx
    from graphamp.plans.plan import Plan

    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        bert = export_onnx("bert", folder / "bert.onnx", "full")
        plan_s, _ = median_time(lambda: gonnx.analyse(bert).plan.to_json(), args.runs)
        bert_nodes = len(gonnx.analyse(bert).plan.nodes)
        bert_mb = bert.stat().st_size / 2**20
        plan_wall = wall(
            [
                sys.executable,
                "-m",
                "graphamp.cli",
                "plan",
                str(bert),
                "--format",
                "json",
                "-o",
                str(folder / "bert.json"),
            ],
            args.runs,
        )

        chain = folder / "chain.onnx"
        onnx.save(chain_model(args.nodes), str(chain))
        middle = f"n{args.nodes // 2 - (args.nodes // 2) % 8}"  # a MatMul in the middle
        a, b = folder / "a.json", folder / "b.json"
        gonnx.analyse(chain).plan.save(a)
        gonnx.analyse(chain, deny_names=[middle]).plan.save(b)

        def diff() -> str:
            return Plan.load(a).diff(Plan.load(b)).to_text()

        changed = [line for line in diff().splitlines() if line.startswith("-n")]
        diff_s, _ = median_time(diff, args.runs)
        diff_wall = wall([sys.executable, "-m", "graphamp.cli", "diff", str(a), str(b)], args.runs)

    print("| what | after import s | whole command s | target |")
    print("|---|---|---|---|")
    print(
        f"| `graphamp plan` BERT-base-style (full size, {bert_nodes} nodes, {bert_mb:.0f} MB) | "
        f"{plan_s:.2f} | "
        f"{plan_wall:.2f} | < 1 s after import |"
    )
    print(
        f"| `graphamp diff` of two plans of a {args.nodes}-node chain ({len(changed)} nodes "
        f"changed) | {diff_s:.2f} | {diff_wall:.2f} | < 2 s |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
