"""Wall-clock and CPU time of converting the synthetic chain of ``bench_onnx.py``, by phase.

    python tools/bench/bench_chain.py --nodes 50000 --repeats 5
    python tools/bench/bench_chain.py --spread cost,tensorflow

End to end is ``graphamp.onnx.convert(proto).to_proto()`` (what ``bench_onnx.py --chain``
times): load (validation, ONNX type inference), read into the OpGraph, the passes, apply (the
edits) and to_proto; the proto is read and patched as a protobuf (docs/ARCHITECTURE.md, "The
ONNX dialect's reader and writer"). Medians of ``--repeats`` runs after one warm-up run on a
small chain; ``--spread cost,tensorflow`` times the cost pass (the policy's default) and
TensorFlow's colouring (what the figures before issue 28 ran) alike, alternating; the load
average and the CPU are printed with them because other processes share the machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_onnx import chain_model

from graphamp import engine
from graphamp.onnx.conversion import Conversion
from graphamp.onnx.dialect.plugin import OnnxDialect
from graphamp.policy.policy import Policy


def convert(proto: object, spread: str = "cost") -> Conversion:
    policy = Policy.create(where="bench", spread=spread)
    result = engine.convert(proto, policy, dialect=OnnxDialect())
    return Conversion(result.model, result.plan, result.seconds, result.graph)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--spread",
        default="cost",
        help="how infer/clear ops are decided, comma-separated to time each in the same run: "
        "cost (ONNX's default since issue 28), tensorflow (the colouring of the earlier figures)",
    )
    args = parser.parse_args()
    proto = chain_model(args.nodes)
    spreads = args.spread.split(",")
    for spread in spreads:  # warm-up: imports, caches
        convert(chain_model(1000), spread).to_proto()
    rows: dict[str, list[dict[str, float]]] = {f"spread {spread}": [] for spread in spreads}
    for _ in range(args.repeats):
        for spread in spreads:
            label = f"spread {spread}"
            # The previous run's graph is freed before the clock starts, not inside this run.
            conversion = None
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            conversion = convert(proto, spread)
            middle = time.perf_counter()
            conversion.to_proto()
            end = time.perf_counter()
            row = dict(conversion.seconds)
            row["to_proto"] = end - middle
            row["total wall"] = end - wall
            row["total cpu"] = time.process_time() - cpu
            rows[label].append(row)
    print(f"{args.nodes} nodes, median of {args.repeats}; {cpu_name()}, {os.cpu_count()} CPUs")
    print(f"load average {os.getloadavg()}")
    for label, runs in rows.items():
        print(f"-- {label}")
        for key in runs[0]:
            values = [row[key] for row in runs]
            spread = " ".join(f"{v:.2f}" for v in values)
            print(f"{key:>11}: {statistics.median(values):6.2f} s   ({spread})")


if __name__ == "__main__":
    main()
