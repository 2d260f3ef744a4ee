"""Wall-clock and CPU time of converting the synthetic chain of ``bench_onnx.py``, by phase.

    python tools/bench_chain.py --nodes 50000 --repeats 5

End to end is ``graphamp.onnx.convert(proto).to_proto()`` (what ``bench_onnx.py --chain``
times): load (validation, onnx_ir's deserialisation, type inference), read into the OpGraph,
the passes, apply (the edits on the onnx_ir model) and to_proto (onnx_ir's serialisation).
Medians of ``--repeats`` runs after one warm-up run on a small chain; the load average is
printed with them because other processes share the machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_onnx import chain_model

import graphamp.onnx as gonnx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    proto = chain_model(args.nodes)
    gonnx.convert(chain_model(1000)).to_proto()  # warm-up: imports, schema caches
    rows = []
    for _ in range(args.repeats):
        # The previous run's graph is freed before the clock starts, not inside this run.
        conversion = None
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        conversion = gonnx.convert(proto)
        middle = time.perf_counter()
        conversion.to_proto()
        end = time.perf_counter()
        row = dict(conversion.seconds)
        row["to_proto"] = end - middle
        row["total wall"] = end - wall
        row["total cpu"] = time.process_time() - cpu
        rows.append(row)
    print(f"{args.nodes} nodes, median of {args.repeats}; load average {os.getloadavg()}")
    for key in rows[0]:
        values = [row[key] for row in rows]
        runs = " ".join(f"{v:.2f}" for v in values)
        print(f"{key:>11}: {statistics.median(values):6.2f} s   ({runs})")


if __name__ == "__main__":
    main()
