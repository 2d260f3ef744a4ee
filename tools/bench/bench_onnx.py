"""Benchmark graphamp's ONNX conversion against the float16 converters users pick today.

For each full-size zoo model (one fresh process per model, so one model's memory and caches do
not colour the next) it converts with:

* graphamp (``keep_io_types=True``, default lists),
* onnxconverter-common ``convert_float_to_float16(keep_io_types=True)``,
* onnxruntime's transformers ``OnnxModel.convert_float_to_float16(keep_io_types=True)``,

and reports conversion time (median of ``--repeats`` after one warm-up), Casts, Casts whose
input is a Cast, Casts to the type their input already has, the share of MatMul/Gemm/Conv in
float16, file size, whether the checker passes and onnxruntime loads it, the error against the
float32 model on the same random inputs (max relative to max |y|, NaN/Inf), and onnxruntime
latency (median of ``--runs`` after a warm-up). Then a synthetic chain of up to 50,000 nodes
shows how conversion time grows with graph size.

    python tools/bench/bench_onnx.py                        # everything, full size (about 10 min)
    python tools/bench/bench_onnx.py --models bert --runs 3
    python tools/bench/bench_onnx.py --size small --chain 5000   # a quick smoke run
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import date
from pathlib import Path

import numpy as np
import onnx
from benchlib import machine, median_time

TOOLS = ("graphamp", "onnxconverter-common", "ort-transformers")
LOW = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
MATRIX = ("MatMul", "Gemm", "Conv")


def convert_with(tool: str, proto: onnx.ModelProto) -> onnx.ModelProto:
    model = copy.deepcopy(proto)  # each tool gets its own copy; the copy is not timed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        if tool == "graphamp":
            import graphamp.onnx as gonnx

            converted = gonnx.convert(model, keep_io_types=True).to_proto()
        elif tool == "onnxconverter-common":
            from onnxconverter_common import float16

            converted = float16.convert_float_to_float16(model, keep_io_types=True)
        else:
            from onnxruntime.transformers.onnx_model import OnnxModel

            wrapper = OnnxModel(model)
            wrapper.convert_float_to_float16(keep_io_types=True)
            converted = wrapper.model
        convert_with.last_seconds = time.perf_counter() - start  # type: ignore[attr-defined]
    return converted


def cast_stats(proto: onnx.ModelProto) -> dict[str, object]:
    import graphamp.onnx as gonnx

    types = gonnx.inferred_types(proto)
    producers = {out: node for node in proto.graph.node for out in node.output}
    casts = [n for n in proto.graph.node if n.op_type == "Cast"]
    cast_of_cast = sum(
        1 for n in casts if n.input[0] in producers and producers[n.input[0]].op_type == "Cast"
    )
    same_type = sum(
        1
        for n in casts
        if types.get(n.input[0]) == next(a.i for a in n.attribute if a.name == "to")
    )
    matrix = [n for n in proto.graph.node if n.op_type in MATRIX]
    low = sum(1 for n in matrix if types.get(n.input[0]) in LOW)
    return {
        "casts": len(casts),
        "cast_of_cast": cast_of_cast,
        "cast_same_type": same_type,
        "matrix_low": f"{low}/{len(matrix)}",
        "matrix_low_share": low / len(matrix) if matrix else None,
    }


def latency(session, feeds: dict[str, np.ndarray], runs: int) -> float:  # type: ignore[no-untyped-def]
    names = [o.name for o in session.get_outputs()]
    seconds, _ = median_time(lambda: session.run(names, feeds), runs)
    return seconds


def bench_model(name: str, size: str, repeats: int, runs: int) -> dict[str, object]:
    import onnxruntime as ort

    from graphamp.models import export_onnx
    from graphamp.numerics import verify

    def session(model: onnx.ModelProto) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        return ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )

    def typed(model: onnx.ModelProto) -> dict[str, np.ndarray]:
        dtypes = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
        return {
            k: v.astype(np.float16) if dtypes.get(k) == onnx.TensorProto.FLOAT16 else v
            for k, v in feeds.items()
        }

    with tempfile.TemporaryDirectory() as tmp:
        path = export_onnx(name, Path(tmp) / f"{name}.onnx", size)
        proto = onnx.load(str(path))
    feeds = verify.random_inputs(proto, seed=0)
    reference_session = session(proto)
    names = [o.name for o in reference_session.get_outputs()]
    reference = dict(zip(names, reference_session.run(names, feeds), strict=True))
    result: dict[str, object] = {
        "model": name,
        "size": size,
        "nodes": len(proto.graph.node),
        "file_mb": proto.ByteSize() / 2**20,
        "float32_latency_ms": latency(reference_session, feeds, runs) * 1e3,
        "tools": {},
    }
    for tool in TOOLS:
        row: dict[str, object] = {}
        result["tools"][tool] = row  # type: ignore[index]
        try:
            seconds, converted = median_time(lambda t=tool: convert_with(t, proto), repeats)
        except Exception as exc:  # a converter that fails is a result, not a crash
            row["error"] = f"conversion failed: {type(exc).__name__}: {str(exc)[:160]}"
            continue
        row["convert_s"] = seconds
        row["file_mb"] = converted.ByteSize() / 2**20
        row.update(cast_stats(converted))  # type: ignore[arg-type]
        try:
            onnx.checker.check_model(converted, full_check=True)  # type: ignore[arg-type]
            row["checker"] = "ok"
        except Exception as exc:
            row["checker"] = f"fails: {str(exc).splitlines()[0][:120]}"
        try:
            converted_session = session(converted)  # type: ignore[arg-type]
        except Exception as exc:
            row["ort_loads"] = f"no: {str(exc).splitlines()[0][:160]}"
            continue
        row["ort_loads"] = "yes"
        outputs = dict(zip(names, converted_session.run(names, typed(converted)), strict=True))  # type: ignore[arg-type]
        report = verify.compare(
            reference, outputs, rtol=verify.DEFAULT_RTOL["float16"], atol=0.0, provider="cpu"
        )
        row["max_rel_error"] = max(o.max_rel_error for o in report.outputs)
        row["nan_inf"] = sum(o.nan_inf for o in report.outputs)
        row["latency_ms"] = latency(converted_session, typed(converted), runs) * 1e3  # type: ignore[arg-type]
    return result


def chain_model(nodes: int) -> onnx.ModelProto:
    """A chain that exercises every list: MatMul, Add, Relu, Sigmoid, Exp, Log, MatMul, ..."""
    from onnx import helper, numpy_helper

    pattern = ["MatMul", "Add", "Relu", "Sigmoid", "MatMul", "Exp", "Log", "Relu"]
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.3).astype(np.float32), "w"),
        numpy_helper.from_array((rng.standard_normal((8,)) * 0.1).astype(np.float32), "b"),
    ]
    graph_nodes, previous = [], "x"
    for index in range(nodes):
        op = pattern[index % len(pattern)]
        inputs = (
            [previous, "w"] if op == "MatMul" else [previous, "b"] if op == "Add" else [previous]
        )
        graph_nodes.append(helper.make_node(op, inputs, [f"t{index}"], name=f"n{index}"))
        previous = f"t{index}"
    graph = helper.make_graph(
        graph_nodes,
        "chain",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info(previous, onnx.TensorProto.FLOAT, None)],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])


def bench_chain(sizes: list[int], repeats: int) -> list[dict[str, object]]:
    import graphamp.onnx as gonnx

    rows = []
    for size in sizes:
        proto = chain_model(size)
        seconds, converted = median_time(lambda p=proto: gonnx.convert(p).to_proto(), repeats)
        onnx.checker.check_model(converted, full_check=True)  # type: ignore[arg-type]
        casts = sum(1 for n in converted.graph.node if n.op_type == "Cast")
        rows.append(
            {
                "nodes": size,
                "convert_s": seconds,
                "us_per_node": seconds / size * 1e6,
                "casts": casts,
            }
        )
    return rows


def markdown(results: list[dict[str, object]], chain: list[dict[str, object]]) -> str:
    lines = [
        "| model | tool | convert s | Casts | Cast of Cast | Cast to same type | "
        "MatMul/Gemm/Conv fp16 | file MB | checker | ORT loads | max rel err | NaN/Inf | "
        "ORT CPU ms (fp32 ms) |",
        "|" + "---|" * 13,
    ]
    for result in results:
        for tool, row in result["tools"].items():
            if "error" in row:
                lines.append(f"| {result['model']} | {tool} | {row['error']} |" + " |" * 11)
                continue
            err = f"{row['max_rel_error']:.2e}" if "max_rel_error" in row else "-"
            lat = f"{row['latency_ms']:.1f}" if "latency_ms" in row else "-"
            lines.append(
                f"| {result['model']} | {tool} | {row['convert_s']:.2f} | {row['casts']} | "
                f"{row['cast_of_cast']} | {row['cast_same_type']} | {row['matrix_low']} | "
                f"{row['file_mb']:.1f} | {row['checker']} | {row['ort_loads']} | {err} | "
                f"{row.get('nan_inf', '-')} | {lat} ({result['float32_latency_ms']:.1f}) |"
            )
    if chain:
        lines += [
            "",
            "| chain nodes | graphamp convert s | µs per node | Casts |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['nodes']} | {r['convert_s']:.2f} | {r['us_per_node']:.1f} | {r['casts']} |"
            for r in chain
        ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models",
        default="simplenet,mnist,resnet,bert,gpt",
        help="comma-separated zoo models (default: all)",
    )
    parser.add_argument("--size", default="full", choices=("small", "full"))
    parser.add_argument("--repeats", type=int, default=3, help="timed conversions per tool")
    parser.add_argument("--runs", type=int, default=5, help="timed onnxruntime runs per model")
    parser.add_argument(
        "--chain",
        type=int,
        default=50_000,
        help="largest synthetic chain (0: skip); also 1/8, 1/4, 1/2 of it",
    )
    parser.add_argument("--json", metavar="FILE", help="write all numbers as JSON")
    parser.add_argument("--one", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.one:  # child process: one model, JSON on stdout
        print(json.dumps(bench_model(args.one, args.size, args.repeats, args.runs)))
        return 0

    print(f"# graphamp ONNX benchmark, {date.today().isoformat()}")
    print(f"machine: {machine()}")
    print(
        f"command: python tools/bench/bench_onnx.py {' '.join(sys.argv[1:])}".rstrip(), flush=True
    )
    results = []
    for name in [m for m in args.models.split(",") if m]:
        print(f"... {name} ({args.size})", file=sys.stderr, flush=True)
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--one",
                name,
                "--size",
                args.size,
                "--repeats",
                str(args.repeats),
                "--runs",
                str(args.runs),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if child.returncode != 0:
            print(child.stderr[-2000:], file=sys.stderr)
            return 1
        results.append(json.loads(child.stdout.strip().splitlines()[-1]))
    chain = []
    if args.chain:
        print("... synthetic chain", file=sys.stderr, flush=True)
        chain = bench_chain(
            [args.chain // 8, args.chain // 4, args.chain // 2, args.chain], args.repeats
        )
    print(markdown(results, chain))
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "chain": chain}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
