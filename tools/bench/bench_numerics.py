"""Benchmark of ``graphamp tune`` on zoo models with a planted float16 fault.

For BERT-base-size and GPT-2-size models of the zoo (random weights, built in code), the fault
is planted in the feed-forward block of a few layers, as in T5: the first Linear's weight and
bias are multiplied by S and the second Linear's weight divided by S, so the float32 model
computes nearly the same function while its hidden activations pass float16's 65504 (S is
chosen from the unplanted model's own largest activation there). Then, on the same random
batches:

* the baseline conversion's error (faithful evaluator: float16 rounding emulated);
* ``tune``: wall time, evaluations, the size of the set it keeps float32, and the error of
  the tuned conversion;
* the minimal set: per faulty block, the smallest subset of the block's nodes that meets the
  tolerance with every other faulty block kept float32, found by trying every subset in order
  of size with the switchable evaluator (exhaustive within the block);
* onnxconverter-common's ``auto_convert_mixed_precision`` on the same model, data (it takes one
  feed dict: the first batch) and tolerance metric (max |y - y32| / max |y32| per output, as a
  ``validate_fn``), in a subprocess with a time limit; its result's error is measured with the
  faithful evaluator.

    .venv/bin/python tools/bench/bench_numerics.py --work /tmp/bench-numerics [--models bert gpt]
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import machine

from graphamp import engine
from graphamp.numerics.inputs import random_inputs
from graphamp.onnx.dialect.plugin import OnnxDialect
from graphamp.onnx.numerics.calibration import calibrate
from graphamp.onnx.numerics.runtime import input_specs
from graphamp.onnx.numerics.session import Session
from graphamp.onnx.numerics.switchable import Switchable
from graphamp.onnx.numerics.tuning import Decider, tune
from graphamp.policy.policy import Policy

FAULTY_LAYERS = {"bert": (3, 8), "gpt": (2, 9)}
CANCELLING_LAYERS = {"bert": (5,), "gpt": (5,)}
OFFSET = 2000.0  # float16's spacing there is 1 to 2


def block_nodes(proto: onnx.ModelProto, layer: int) -> list[str]:
    """The feed-forward block of ``layer``: mlp.0 MatMul/Add, the GELU's nodes, mlp.2 MatMul."""
    prefix = f"/layers.{layer}/mlp/"
    names = [n.name for n in proto.graph.node if n.name.startswith(prefix)]
    names = [n for n in names if "Constant" not in n and not n.endswith("mlp.2/Add")]
    return names


def plant(proto: onnx.ModelProto, layers: tuple[int, ...], largest: dict[int, float]) -> None:
    """Scale each faulty block in place so its hidden activations reach 4 x 65504."""
    inits = {init.name: init for init in proto.graph.initializer}
    nodes = {n.name: n for n in proto.graph.node}
    for layer in layers:
        scale = np.float32(4 * 65504 / largest[layer])
        first = nodes[f"/layers.{layer}/mlp/mlp.0/MatMul"].input[1]
        bias = next(i for i in nodes[f"/layers.{layer}/mlp/mlp.0/Add"].input if i in inits)
        second = nodes[f"/layers.{layer}/mlp/mlp.2/MatMul"].input[1]
        for name, factor in ((first, scale), (bias, scale), (second, 1 / scale)):
            values = numpy_helper.to_array(inits[name]).astype(np.float32) * np.float32(factor)
            inits[name].CopyFrom(numpy_helper.from_array(values.astype(np.float32), name))


def plant_cancellation(proto: onnx.ModelProto, layers: tuple[int, ...]) -> None:
    """Shift each block's hidden values by OFFSET (mlp.0's bias) and take it back after mlp.2
    (its bias less OFFSET x the column sums of its weight): the GELU of values near 2000 is the
    identity, so the float32 model keeps its function, but float16 rounds the hidden values to
    a spacing of 1 to 2 and mlp.2's Add cancels two values near 2000."""
    inits = {init.name: init for init in proto.graph.initializer}
    nodes = {n.name: n for n in proto.graph.node}
    for layer in layers:
        first = next(i for i in nodes[f"/layers.{layer}/mlp/mlp.0/Add"].input if i in inits)
        second = nodes[f"/layers.{layer}/mlp/mlp.2/MatMul"].input[1]
        last = next(i for i in nodes[f"/layers.{layer}/mlp/mlp.2/Add"].input if i in inits)
        weight = numpy_helper.to_array(inits[second]).astype(np.float32)
        shifted = {
            first: numpy_helper.to_array(inits[first]) + np.float32(OFFSET),
            last: numpy_helper.to_array(inits[last]) - np.float32(OFFSET) * weight.sum(axis=0),
        }
        for name, values in shifted.items():
            inits[name].CopyFrom(numpy_helper.from_array(values.astype(np.float32), name))


def planted_model(name: str, work: Path, batches: list[dict[str, np.ndarray]], fault: str) -> Path:
    from graphamp.models import export_onnx

    path = work / f"{name}.{fault}.onnx"
    if path.exists():
        return path
    clean = export_onnx(name, work / f"{name}.onnx", "full")
    proto = onnx.load(str(clean), load_external_data=True)
    if fault == "cancellation":
        plant_cancellation(proto, CANCELLING_LAYERS[name])
        onnx.save(proto, str(path))
        return path
    ranges = calibrate(proto, batches[:1])
    largest = {
        layer: ranges.tensors[
            next(
                n.output[0] for n in proto.graph.node if n.name == f"/layers.{layer}/mlp/mlp.0/Add"
            )
        ].max_abs
        for layer in FAULTY_LAYERS[name]
    }
    plant(proto, FAULTY_LAYERS[name], largest)
    onnx.save(proto, str(path))
    return path


def minimal_set(proto, batches, expected, blocks, rtol):  # type: ignore[no-untyped-def]
    """Per block, the smallest subset that meets rtol with the other blocks kept float32."""
    policy = Policy.create("float16")
    analysis = engine.analyse(proto, policy, dialect=OnnxDialect())
    decide = Decider(analysis, policy, None)
    switch = Switchable(proto, analysis.graph, "float16")
    evaluations = 0

    def meets(kept: frozenset[str]) -> bool:
        nonlocal evaluations
        evaluations += 1
        low = decide(kept)
        for feeds, want in zip(batches, expected, strict=True):
            got = switch.run(feeds, low)
            for output, value in want.items():
                diff = np.abs(got[output].astype(np.float64) - value)
                if not np.isfinite(got[output]).all() or diff.max() / np.abs(value).max() > rtol:
                    return False
        return True

    found: list[str] = []
    for index, block in enumerate(blocks):
        others = {n for j, b in enumerate(blocks) if j != index for n in b}
        best = None
        for size in range(len(block) + 1):
            for subset in itertools.combinations(block, size):
                if meets(frozenset(others | set(subset))):
                    best = list(subset)
                    break
            if best is not None:
                break
        found += best or block
    return found, evaluations


def _occ_worker(path: str, feeds: dict, rtol: float, out: str, queue) -> None:  # type: ignore[no-untyped-def]
    import contextlib
    import io

    from onnxconverter_common import auto_mixed_precision

    def within(reference, converted):  # type: ignore[no-untyped-def]
        return all(
            np.abs(np.asarray(b, np.float64) - a).max() / np.abs(a).max() <= rtol
            for a, b in zip(reference, converted, strict=True)
        )

    model = onnx.load(path)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            converted = auto_mixed_precision.auto_convert_mixed_precision(
                model, feeds, validate_fn=within, keep_io_types=True
            )
        onnx.save(converted, out)
        queue.put(("ok", ""))
    except Exception as exc:  # report the library's failure as it is
        queue.put(("failed", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))


def onnxconverter_common(path, feeds, rtol, limit, work, batches, expected):  # type: ignore[no-untyped-def]
    """auto_convert_mixed_precision in a subprocess killed after ``limit`` seconds."""
    out = work / f"{path.stem}.occ.onnx"
    queue: multiprocessing.Queue = multiprocessing.Queue()
    process = multiprocessing.Process(
        target=_occ_worker, args=(str(path), feeds, rtol, str(out), queue)
    )
    start = time.perf_counter()
    process.start()
    process.join(limit)
    seconds = time.perf_counter() - start
    if process.is_alive():
        process.kill()
        process.join()
        return {"status": f"still running after {limit} s (killed)", "seconds": seconds}
    status, message = queue.get() if not queue.empty() else ("failed", "no result")
    result: dict[str, object] = {"status": status, "seconds": seconds}
    if message:
        result["error"] = message
    if status == "ok":
        converted = onnx.load(str(out))
        kept = sum(
            1
            for n in converted.graph.node
            if n.op_type not in ("Cast", "Constant") and not _has_float16_output(converted, n)
        )
        result["nodes_not_float16"] = kept
        result["max_rel_error"] = _faithful_error(converted, batches, expected)
    return result


def _has_float16_output(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    from graphamp.onnx.io.files import inferred_types

    types = _has_float16_output.__dict__.setdefault(id(model), inferred_types(model))
    return any(types.get(o) == onnx.TensorProto.FLOAT16 for o in node.output)


def _faithful_error(model: onnx.ModelProto, batches, expected) -> float:  # type: ignore[no-untyped-def]
    from graphamp.onnx.io.files import inferred_types
    from graphamp.onnx.numerics.emulate import emulated

    session = Session(emulated(model, inferred_types(model)))
    worst = 0.0
    for feeds, want in zip(batches, expected, strict=True):
        got = session.run(feeds)
        for output, value in want.items():
            diff = np.abs(got[output].astype(np.float64) - value)
            error = (
                np.inf if not np.isfinite(got[output]).all() else diff.max() / np.abs(value).max()
            )
            worst = max(worst, float(error))
    return worst


def bench(name: str, args: argparse.Namespace) -> dict[str, object]:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    clean = work / f"{name}.onnx"
    if not clean.exists():
        from graphamp.models import export_onnx

        export_onnx(name, clean, "full")
    specs = input_specs(onnx.load(str(clean), load_external_data=False))
    batches = [random_inputs(specs, seed=seed) for seed in range(args.batches)]
    path = planted_model(name, work, batches, args.fault)
    proto = onnx.load(str(path))
    reference = Session(proto)
    expected = [{k: v.astype(np.float64) for k, v in reference.run(f).items()} for f in batches]
    del reference
    result: dict[str, object] = {
        "model": name,
        "fault": args.fault,
        "nodes": len(proto.graph.node),
    }
    result["batches"] = f"{args.batches} x {', '.join(f'{s.name} {s.shape}' for s in specs)}"
    load = os.getloadavg()[0]
    start = time.perf_counter()
    tuned = tune(path, batches, rtol=args.rtol)
    result["tune"] = {
        "seconds": round(time.perf_counter() - start, 1),
        "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
        "evaluations": tuned.evaluations,
        "real_conversions": tuned.real_evaluations,
        "set": list(tuned.kept),
        "set_size": len(tuned.kept),
        "candidates": tuned.candidates,
        "met": tuned.met,
        "max_rel_error": tuned.errors,
        "baseline_max_rel_error": tuned.baseline_errors,
    }
    print(json.dumps(result, indent=1), flush=True)
    layers = FAULTY_LAYERS if args.fault == "overflow" else CANCELLING_LAYERS
    blocks = [block_nodes(proto, layer) for layer in layers[name]]
    if not args.skip_minimal:
        start = time.perf_counter()
        minimal, evaluations = minimal_set(proto, batches, expected, blocks, args.rtol)
        result["minimal"] = {
            "set": minimal,
            "size": len(minimal),
            "evaluations": evaluations,
            "seconds": round(time.perf_counter() - start, 1),
        }
    if not args.skip_occ:
        result["onnxconverter_common"] = onnxconverter_common(
            path, batches[0], args.rtol, args.occ_limit, work, batches, expected
        )
    print(json.dumps(result, indent=1), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="/tmp/bench-numerics", help="models are kept here")
    parser.add_argument("--models", nargs="+", default=["bert", "gpt"], choices=FAULTY_LAYERS)
    parser.add_argument("--fault", choices=("overflow", "cancellation"), default="overflow")
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--rtol", type=float, default=0.01)
    parser.add_argument("--occ-limit", type=float, default=300.0, help="seconds")
    parser.add_argument("--skip-minimal", action="store_true")
    parser.add_argument("--skip-occ", action="store_true", help="skip onnxconverter-common")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    print(machine(), flush=True)
    results = [bench(name, args) for name in args.models]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
