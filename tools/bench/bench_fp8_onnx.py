"""Float8 ONNX figures (issue 41): the zoo's BERT and GPT converted with ``--fp8 --calibrate``.

For each model (small by default; ``--size full`` for the BERT-base and GPT-2-sized ones):
calibrate on ``--calibration`` batches, convert to float16 with float8 (``Float8.static()``)
and without, and measure on held-out batches against the float32 model the largest error
relative to max |y| over every output and batch, as ``--verify`` does (faithful evaluator:
onnxruntime CPU over the emulated model, float16 rounding emulated, QuantizeLinear/
DequantizeLinear exact), over the first N held-out batches for each N of ``--held-out``.

The largest error is an extreme of float8's rounding noise: ``--seeds K`` converts again with
K calibration sets and gives the median and range of the figures over them (each calibration
puts the activations' rounding grid elsewhere: its scale is max|x| * 2 / 448).

Weight bytes: every initializer of the float8 model against the float16 model's and the
float32 model's, and by role: matrix-op weights stored float8 (with their scales), matrix-op
weights kept in the low type, embedding tables (read by Gather), the rest. Also which matrix ops
are float8 and why the rest are not; onnxruntime vs ``onnx.reference`` on the float8 model (small
models only; ``onnx.reference`` divides float16 by float16 in float16 inside QuantizeLinear, a
second rounding the runtimes do not make). With ``MODELOPT_PYTHON`` (``tools/setup-modelopt.sh``),
ModelOpt's FP8 mode on the same BERT and data, measured the same way, and the nodes it put in
float8.

``--variants`` names the float8 settings measured, each against the same reference outputs and
calibration: ``default`` (``Float8.static()``, what ``convert --fp8`` does), ``embeddings``
(``--fp8-embeddings``: embedding tables stored int8 per row), ``embeddings+last`` (also the last
matrix op, the LM head, in float8 where its shape allows: ``keep_last=False``),
``embeddings+kept`` (``--fp8-embeddings --fp8-kept-int8``: also the weights of the products
kept out of float8, the LM head's among them, stored int8 per output channel, weight-only).

``--tune`` also runs ``tune --fp8`` (graphamp.onnx.numerics.fp8_tuning) with rtol the issue's
bar for the model (BERT 2.5e-2, GPT 1.5e-2; ``--tune-scale`` multiplies it) on ``--tune-batches``
batches of their own (seed 2: neither the calibration data, seed 0, nor the held-out data,
seed 1), from the same calibration, and measures the tuned model as the plain one: its error
on the held-out batches, its float8 products, its weight bytes, and tune's wall time.

    python tools/bench/bench_fp8_onnx.py [--size small] [--models bert gpt] [--held-out 4 16]
        [--seeds 1] [--variants default embeddings embeddings+last embeddings+kept]
        [--tune [--tune-batches 4] [--tune-scale 1]] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
from graphamp.onnx.numerics.runtime import input_specs, runner

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import machine

MATRIX = ("MatMul", "Gemm", "Conv")
BARS = {"bert": 2.5e-2, "gpt": 1.5e-2}  # issue 41: the largest error allowed vs float32
VARIANTS = {  # --variants: the float8 settings measured
    "default": {},
    "embeddings": {"embeddings": True},
    "embeddings+last": {"embeddings": True, "keep_last": False},
    "embeddings+kept": {"embeddings": True, "kept_int8": True},
}
REFERENCE_MAX_BYTES = 16 * 1024 * 1024  # onnx.reference runs float16 MatMuls slowly


def batches(model: onnx.ModelProto, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """``count`` batches of random token ids in the shapes the model declares, each id below
    the size of the table it indexes."""
    rng = np.random.default_rng(seed)
    specs = input_specs(model)
    out = []
    for _ in range(count):
        feeds = {}
        for spec in specs:
            shape = tuple(d if d is not None else 2 for d in spec.shape)
            feeds[spec.name] = rng.integers(0, spec.index_bound or 2, shape).astype(np.int64)
        out.append(feeds)
    return out


class Errors:
    """The largest error relative to max |y| of models against one reference, per batch (the
    reference's outputs computed once)."""

    def __init__(self, reference: onnx.ModelProto, data: list[dict[str, np.ndarray]]) -> None:
        evaluate, _ = runner(reference)
        self.data, self.expected = data, [evaluate(feeds) for feeds in data]

    def per_batch(self, model: onnx.ModelProto) -> list[float]:
        evaluate, evaluator = runner(model)
        assert "onnxruntime cpu" in evaluator, evaluator
        found = []
        for feeds, expected in zip(self.data, self.expected, strict=True):
            outputs = evaluate(feeds)
            worst = 0.0
            for name, value in expected.items():
                value = np.asarray(value, np.float64)
                diff = np.abs(np.asarray(outputs[name], np.float64) - value).max()
                worst = max(worst, float(diff / np.abs(value).max()))
            found.append(worst)
        return found


def over(per_batch: list[float], counts: list[int]) -> dict[str, float]:
    """The largest error over the first N batches, for each N of ``counts``."""
    return {str(n): max(per_batch[:n]) for n in counts}


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


def weight_roles(model: onnx.ModelProto) -> dict[str, int]:
    """Bytes of the stored values by role: ``float8`` (matrix-op weights stored float8, with
    their scales), ``int8`` (kept matrix ops' weights stored int8, with their scales),
    ``matrix_low`` (matrix-op weights read as they are), ``embedding`` (tables a Gather reads),
    ``other`` (biases, norms, activation scales, ...). Each initializer counts once, in the
    first role that holds."""
    inits = {init.name: init for init in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}
    role: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type in MATRIX:
            for value in node.input[:2]:
                source = producers.get(value)
                if source is not None and source.op_type == "DequantizeLinear":
                    stored = inits.get(source.input[0])
                    if stored is not None:  # a stored weight (not an activation's Q)
                        kind = "int8" if stored.data_type == onnx.TensorProto.INT8 else "float8"
                        role.update(dict.fromkeys(source.input[:2], kind))
                elif value in inits:
                    role.setdefault(value, "matrix_low")
        elif node.op_type == "Gather" and node.input[0] in inits:
            # a table: int8, and its row scales, with --fp8-embeddings
            role.setdefault(node.input[0], "embedding")
        elif node.op_type == "Add":
            # a position table added to a lookup: int8 through a DequantizeLinear with
            # --fp8-embeddings (its scales too), else the stored 2-D value itself
            for value in node.input:
                source = producers.get(value)
                if source is not None and source.op_type == "DequantizeLinear":
                    if source.input[0] in inits:
                        role.update(dict.fromkeys(source.input[:2], "embedding"))
                elif value in inits and len(inits[value].dims) == 2:
                    role.setdefault(value, "embedding")
    found = dict.fromkeys(("float8", "int8", "matrix_low", "embedding", "other"), 0)
    for name, init in inits.items():
        found[role.get(name, "other")] += onnx.numpy_helper.to_array(init).nbytes
    return found


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


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(name: str, size: str, args: argparse.Namespace, folder: Path) -> list[dict]:
    """The figures of each of ``args.variants`` on one model."""
    path = export_onnx(name, folder / f"{name}.onnx", size)
    reference = onnx.load(str(path))
    counts = sorted(args.held_out)
    calibrate_data = batches(reference, args.calibration, seed=0)
    errors = Errors(reference, batches(reference, max(counts), seed=1))
    f16_model = gonnx.convert(str(path)).to_proto()
    f16_error = over(errors.per_batch(f16_model), counts)
    ranges = [
        gonnx.calibrate(
            str(path),
            calibrate_data if seed == 0 else batches(reference, args.calibration, 100 + seed),
            histograms=True,
        )
        for seed in range(args.seeds)  # the first: the calibration data of every other figure
    ]
    found = []
    for variant in args.variants:
        settings = graphamp.Float8.static(**VARIANTS[variant])
        result = measure_variant(name, path, reference, settings, ranges, errors, f16_model, args)
        found.append({"variant": variant, **result, "float16_error": f16_error})
        if variant == "default" and os.environ.get("MODELOPT_PYTHON") and name == "bert":
            found[-1].update(against_modelopt(path, calibrate_data, errors, found[-1], args))
    return found


def measure_variant(
    name: str,
    path: Path,
    reference: onnx.ModelProto,
    settings: graphamp.Float8,
    ranges: list,
    errors: Errors,
    f16_model: onnx.ModelProto,
    args: argparse.Namespace,
) -> dict:
    """One float8 setting's figures (the module docstring), over each calibration set."""
    counts = sorted(args.held_out)
    fp8 = None
    per_seed: list[dict[str, float]] = []
    for seed_ranges in ranges:
        converted = gonnx.convert(str(path), fp8=settings, ranges=seed_ranges)
        per_seed.append(over(errors.per_batch(converted.to_proto()), counts))
        fp8 = fp8 or converted
    assert fp8 is not None
    fp8_model = fp8.to_proto()
    rules = Counter(str(d.rule) for d in fp8.plan.fp8.values())
    roles, f16_roles = weight_roles(fp8_model), weight_roles(f16_model)
    total, f16_total = sum(roles.values()), sum(f16_roles.values())
    f32_total = sum(onnx.numpy_helper.to_array(i).nbytes for i in reference.graph.initializer)
    matrix = roles["float8"] + roles["int8"] + roles["matrix_low"]
    f16_matrix = f16_roles["float8"] + f16_roles["int8"] + f16_roles["matrix_low"]
    result = {
        "model": f"{name} ({args.size})",
        "calibration_batches": args.calibration,
        "fp8_error": per_seed[0],
        "weight_bytes": total,
        "float16_weight_bytes": f16_total,
        "float32_weight_bytes": f32_total,
        "weight_ratio": total / f16_total,
        "weight_ratio_to_float32": total / f32_total,
        "matrix_weight_ratio": matrix / f16_matrix,
        "weight_bytes_by_role": roles,
        "float16_weight_bytes_by_role": f16_roles,
        "fp8_nodes": sorted(n for n, d in fp8.plan.fp8.items() if d.rule == "fp8"),
        "kept": {
            n: f"{d.rule}: {d.reason}"
            for n, d in sorted(fp8.plan.fp8.items())
            if d.rule not in ("fp8", "fp8_table")
        },
        "rules": dict(sorted(rules.items())),
        "tables_8bit": [n for n, d in fp8.plan.fp8.items() if d.rule == "fp8_table"],
    }
    if args.seeds > 1:
        result["fp8_error_over_seeds"] = {
            str(n): spread([e[str(n)] for e in per_seed]) for n in counts
        }
    if fp8_model.ByteSize() <= REFERENCE_MAX_BYTES:
        result["ort_vs_reference"] = reference_gap(fp8_model, errors.data[:1])
    if args.tune:
        result["tune"] = tuned(name, path, reference, ranges[0], errors, f16_total, args, settings)
    return result


def against_modelopt(
    path: Path, calibrate_data: list[dict], errors: Errors, result: dict, args: argparse.Namespace
) -> dict:
    """ModelOpt's FP8 mode on the same model and data, beside graphamp's ``result`` (nothing
    where ModelOpt failed)."""
    counts = sorted(args.held_out)
    quantised = modelopt(os.environ["MODELOPT_PYTHON"], path, calibrate_data, path.parent)
    if quantised is None:
        return {}
    error = over(errors.per_batch(quantised), counts)
    return {
        "modelopt_error": error,
        "modelopt_fp8_nodes": float8_nodes(quantised),
        "modelopt_quantisers": dict(
            Counter(n.op_type for n in quantised.graph.node if "uantize" in n.op_type)
        ),
        "error_vs_modelopt": {n: result["fp8_error"][n] / error[n] for n in map(str, counts)},
    }


def tuned(
    name: str, path: Path, reference: onnx.ModelProto, ranges, errors: Errors, f16_bytes: int,
    args: argparse.Namespace, settings: graphamp.Float8,
) -> dict:  # fmt: skip
    """``tune --fp8`` (with the variant's ``settings``) to the issue's bar on batches of its
    own, measured on the held-out ones."""
    from graphamp.onnx.numerics.fp8_tuning import tune_fp8

    rtol = BARS[name] * args.tune_scale
    data = batches(reference, args.tune_batches, seed=2)
    found = tune_fp8(str(path), data, rtol=rtol, ranges=ranges, fp8=settings)
    model = found.conversion.to_proto()
    counts = sorted(args.held_out)
    return {
        "rtol": rtol,
        "tune_batches": args.tune_batches,
        "met_on_tune_data": found.met,
        "seconds": round(found.seconds, 1),
        "evaluations": found.evaluations,
        "runs": found.runs,
        "fp8_products": sum(d.rule == "fp8" for d in found.conversion.plan.fp8.values()),
        "kept": list(found.kept),
        "error": over(errors.per_batch(model), counts),
        "bar": BARS[name],
        "weight_ratio": sum(weight_roles(model).values()) / f16_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=("small", "full"))
    parser.add_argument("--models", nargs="+", default=["bert", "gpt"])
    parser.add_argument("--calibration", type=int, default=4, help="calibration batches")
    parser.add_argument(
        "--held-out", type=int, nargs="+", default=[4, 16], help="held-out batch counts"
    )
    parser.add_argument("--seeds", type=int, default=1, help="calibration sets (error spread)")
    parser.add_argument(
        "--variants", nargs="+", default=["default"], choices=sorted(VARIANTS),
        help="float8 settings to measure (module docstring)",
    )  # fmt: skip
    parser.add_argument("--tune", action="store_true", help="also tune --fp8 to the bars")
    parser.add_argument("--tune-batches", type=int, default=4, help="tune's own batches")
    parser.add_argument("--tune-scale", type=float, default=1.0, help="rtol = scale x bar")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    print(machine())
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-fp8-") as folder:
        for name in args.models:
            for found in measure(name, args.size, args, Path(folder)):
                results.append(found)
                shown = {k: v for k, v in found.items() if k not in ("kept", "fp8_nodes")}
                print(json.dumps(shown, indent=1), flush=True)
                print(f"  float8: {len(found['fp8_nodes'])} matrix ops; kept: ")
                for node, why in found["kept"].items():
                    print(f"    {node}: {why}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
