"""Float8 ONNX figures (issue 41): the zoo's BERT and GPT converted with ``--fp8 --calibrate``.

For each model (small by default): calibrate on ``--calibration`` batches, convert to float16
with float8 (``Float8.static()``) and without, and measure on ``--held-out`` other batches
against the float32 model: the largest error relative to max |y| over every output, from the
faithful evaluator (onnxruntime CPU over the emulated model: float16 rounding emulated,
QuantizeLinear/DequantizeLinear exact), and onnxruntime vs ``onnx.reference`` on the float8
model; the weight bytes (every initializer, and those of the matrix ops only) against the
float16 model's; which matrix ops are float8 and why the rest are not. With
``MODELOPT_PYTHON`` (``tools/setup-modelopt.sh``), ModelOpt's FP8 mode on the same model and
data, measured the same way, and the nodes it put in float8.

    python tools/bench/bench_fp8_onnx.py [--size small] [--models bert gpt] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

import graphamp
import graphamp.onnx as gonnx
from graphamp.models import export_onnx
from graphamp.onnx.runtime import run

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import machine

MATRIX = ("MatMul", "Gemm", "Conv")


def batches(model: str, count: int, seed: int, batch: int = 2, seq: int = 16) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        feeds = {"input_ids": rng.integers(0, 128, (batch, seq)).astype(np.int64)}
        if model == "bert":
            feeds["token_type_ids"] = rng.integers(0, 2, (batch, seq)).astype(np.int64)
        out.append(feeds)
    return out


def error(reference: onnx.ModelProto, other: onnx.ModelProto, data: list[dict]) -> float:
    """Largest |other - reference| / max |reference| over outputs and batches (faithful)."""
    worst = 0.0
    for feeds in data:
        expected, _ = run(reference, feeds)
        found, _ = run(other, feeds)
        for name, value in expected.items():
            value = np.asarray(value, np.float64)
            diff = np.abs(np.asarray(found[name], np.float64) - value).max()
            worst = max(worst, float(diff / np.abs(value).max()))
    return worst


def reference_gap(model: onnx.ModelProto, data: list[dict]) -> float:
    """onnxruntime (QDQ unfused, computing float16 in float32) vs onnx.reference on ``model``."""
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    evaluator = ReferenceEvaluator(model)
    worst = 0.0
    for feeds in data:
        a = [np.asarray(v, np.float64) for v in session.run(None, feeds)]
        b = [np.asarray(v, np.float64) for v in evaluator.run(None, feeds)]
        gaps = [float(np.abs(x - y).max() / np.abs(y).max()) for x, y in zip(a, b, strict=True)]
        worst = max(worst, *gaps)
    return worst


def weight_bytes(model: onnx.ModelProto, matrix_only: bool = False) -> int:
    """Bytes of the stored values (with ``matrix_only``: those a matrix op reads, directly or
    through its DequantizeLinear, with their scales)."""
    inits = {init.name: init for init in model.graph.initializer}
    if not matrix_only:
        names = set(inits)
    else:
        producers = {out: node for node in model.graph.node for out in node.output}
        names = set()
        for node in model.graph.node:
            if node.op_type not in MATRIX:
                continue
            for value in node.input[:2]:
                if value in inits:
                    names.add(value)
                elif value in producers and producers[value].op_type == "DequantizeLinear":
                    names |= {n for n in producers[value].input if n in inits and inits[n].dims}
    return sum(onnx.numpy_helper.to_array(inits[n]).nbytes for n in names)


def float8_nodes(model: onnx.ModelProto) -> list[str]:
    """The matrix ops whose every stored or computed input comes through a DequantizeLinear."""
    producers = {out: node for node in model.graph.node for out in node.output}
    found = []
    for node in model.graph.node:
        if node.op_type in MATRIX or node.op_type == "Add":
            sources = [producers.get(v) for v in node.input[:2] if v]
            if sources and all(s is not None and s.op_type == "DequantizeLinear" for s in sources):
                found.append(node.name)
    return found


def modelopt(python: str, path: Path, data: list[dict], folder: Path) -> onnx.ModelProto | None:
    """ModelOpt's FP8 mode (max calibration, CPU) on ``path`` with ``data``; None on failure."""
    calibration = folder / "modelopt_calibration.npz"
    arrays = {k: np.concatenate([b[k] for b in data]) for k in data[0]}
    np.savez(calibration, **arrays)
    output = folder / f"{path.stem}.modelopt_fp8.onnx"
    command = [
        python, "-m", "modelopt.onnx.quantization", f"--onnx_path={path}",
        "--quantize_mode=fp8", "--calibration_method=max",
        f"--calibration_data_path={calibration}", "--calibration_eps", "cpu",
        "--high_precision_dtype=fp16", f"--output_path={output}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not output.exists():
        print(f"ModelOpt failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
        return None
    return onnx.load(str(output))


def measure(name: str, size: str, calibration: int, held_out: int, folder: Path) -> dict:
    path = export_onnx(name, folder / f"{name}.onnx", size)
    reference = onnx.load(str(path))
    calibrate_data = batches(name, calibration, seed=0)
    test_data = batches(name, held_out, seed=1)
    ranges = gonnx.calibrate(str(path), calibrate_data, histograms=True)
    fp8 = gonnx.convert(str(path), fp8=graphamp.Float8.static(), ranges=ranges)
    f16 = gonnx.convert(str(path))
    fp8_model, f16_model = fp8.to_proto(), f16.to_proto()
    rules = Counter(str(d.rule) for d in fp8.plan.fp8.values())
    result = {
        "model": f"{name} ({size})",
        "calibration_batches": calibration,
        "held_out_batches": held_out,
        "fp8_error": error(reference, fp8_model, test_data),
        "float16_error": error(reference, f16_model, test_data),
        "ort_vs_reference": reference_gap(fp8_model, test_data[:1]),
        "weight_bytes": weight_bytes(fp8_model),
        "float16_weight_bytes": weight_bytes(f16_model),
        "matrix_weight_bytes": weight_bytes(fp8_model, True),
        "float16_matrix_weight_bytes": weight_bytes(f16_model, True),
        "fp8_nodes": sorted(n for n, d in fp8.plan.fp8.items() if d.rule == "fp8"),
        "kept": {
            n: f"{d.rule}: {d.reason}" for n, d in sorted(fp8.plan.fp8.items()) if d.rule != "fp8"
        },
        "rules": dict(sorted(rules.items())),
    }
    result["weight_ratio"] = result["weight_bytes"] / result["float16_weight_bytes"]
    result["matrix_weight_ratio"] = (
        result["matrix_weight_bytes"] / result["float16_matrix_weight_bytes"]
    )
    python = os.environ.get("MODELOPT_PYTHON")
    if python and name == "bert":
        quantised = modelopt(python, path, calibrate_data, folder)
        if quantised is not None:
            result["modelopt_error"] = error(reference, quantised, test_data)
            result["modelopt_fp8_nodes"] = float8_nodes(quantised)
            result["modelopt_quantisers"] = dict(
                Counter(n.op_type for n in quantised.graph.node if "uantize" in n.op_type)
            )
            result["error_vs_modelopt"] = result["fp8_error"] / result["modelopt_error"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--models", nargs="+", default=["bert", "gpt"])
    parser.add_argument("--calibration", type=int, default=4, help="calibration batches")
    parser.add_argument("--held-out", type=int, default=4, help="batches measured on")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    print(machine())
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-fp8-") as folder:
        for name in args.models:
            found = measure(name, args.size, args.calibration, args.held_out, Path(folder))
            results.append(found)
            shown = {k: v for k, v in found.items() if k not in ("kept", "fp8_nodes")}
            print(json.dumps(shown, indent=1))
            print(f"  float8: {len(found['fp8_nodes'])} matrix ops; kept: ")
            for node, why in found["kept"].items():
                print(f"    {node}: {why}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
