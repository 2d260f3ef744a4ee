"""The faithful evaluator against a GPU's own float16 arithmetic, on planted faults.

    python tools/gpu/gpu_numerics.py [--models bert gpt] [--faults overflow cancellation]

For the zoo's full-size BERT and GPT with a fault planted as in ``tools/bench/bench_numerics.py``
(a T5-like feed-forward overflow, or a cancellation near 2000), three float16 conversions:
plain, with ``--calibrate`` on the same batch (the range rule) and ``tune``'s (rtol 1e-2),
with the default policy (inputs and outputs float16 too).
Each runs under the faithful evaluator (onnxruntime on the CPU with every float16 value
rounded as float16 rounds it) and, where onnxruntime has the CUDA provider, on the GPU's real
float16 kernels, with onnxruntime's default ``use_tf32=1`` (float32 MatMul and Conv on TF32
tensor cores, inputs rounded to a 10-bit mantissa like float16's) and with ``use_tf32=0``. Per
evaluator: max |y - y32| / max |y32| against the float32 model on the CPU, and the NaN/Inf
count. The two columns should tell the same story: the faithful
evaluator is what ``--verify``, ``debug`` and ``tune`` use on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_numerics import planted_model
from benchlib import machine

import graphamp.onnx as gonnx
from graphamp.numerics.inputs import random_inputs
from graphamp.onnx.io.files import inferred_types
from graphamp.onnx.numerics.emulate import emulated
from graphamp.onnx.numerics.runtime import _typed_feeds, input_specs
from graphamp.onnx.numerics.session import Session
from graphamp.onnx.numerics.tuning import tune


def score(outputs: list[np.ndarray], expected: list[np.ndarray]) -> tuple[float, int]:
    """(max error relative to max |y32| over the outputs, NaN/Inf count)."""
    worst, bad = 0.0, 0
    for got, want in zip(outputs, expected, strict=True):
        got = np.asarray(got, np.float64)
        bad += int((~np.isfinite(got)).sum())
        finite = np.isfinite(got)
        error = np.abs(got - want)[finite].max(initial=0.0) / np.abs(want).max()
        worst = max(worst, float(error))
    return worst, bad


def cuda_outputs(
    proto: onnx.ModelProto, feeds: dict[str, np.ndarray], tf32: bool
) -> list[np.ndarray] | None:
    """The outputs on onnxruntime's CUDA provider; ``tf32`` is its ``use_tf32`` option (on by
    default: float32 MatMul and Conv then round their inputs to TF32's 10-bit mantissa)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None
    cuda = ("CUDAExecutionProvider", {"use_tf32": "1" if tf32 else "0"})
    session = ort.InferenceSession(
        proto.SerializeToString(), providers=[cuda, "CPUExecutionProvider"]
    )
    if "CUDAExecutionProvider" not in session.get_providers():
        return None  # onnxruntime-gpu without a usable GPU falls back to the CPU
    return session.run(None, _typed_feeds(proto, feeds))


def faithful_outputs(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = Session(emulated(proto, inferred_types(proto)))
    got = session.run(feeds)
    return [got[o.name] for o in proto.graph.output]


def row(label: str, proto: onnx.ModelProto, feeds, expected) -> str:  # type: ignore[no-untyped-def]
    faithful = score(faithful_outputs(proto, feeds), expected)
    cells = []
    for tf32 in (True, False):
        cuda = cuda_outputs(proto, feeds, tf32)
        cells.append("- | -" if cuda is None else "{:.2e} | {}".format(*score(cuda, expected)))
    return f"| {label} | {faithful[0]:.2e} | {faithful[1]} | {' | '.join(cells)} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["bert", "gpt"], choices=["bert", "gpt"])
    parser.add_argument(
        "--faults",
        nargs="+",
        default=["overflow", "cancellation"],
        choices=["overflow", "cancellation"],
    )
    args = parser.parse_args()
    print(f"# {machine()}")
    print(
        "| model, fault, conversion | faithful error | NaN/Inf | CUDA error | NaN/Inf "
        "| CUDA, use_tf32=0 | NaN/Inf |"
    )
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        for name in args.models:
            from graphamp.models import export_onnx

            clean = export_onnx(name, work / f"{name}.onnx", "full")
            specs = input_specs(onnx.load(str(clean), load_external_data=False))
            batches = [random_inputs(specs, seed=0)]
            for fault in args.faults:
                path = planted_model(name, work, batches, fault)
                proto = onnx.load(str(path))
                reference = Session(proto).run(batches[0])
                expected = [np.asarray(reference[o.name], np.float64) for o in proto.graph.output]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    plain = gonnx.convert(path).to_proto()
                    ranges = gonnx.calibrate(path, batches)
                    calibrated = gonnx.convert(path, ranges=ranges).to_proto()
                    tuned = tune(path, batches, rtol=1e-2)
                for label, model in (
                    ("plain", plain),
                    ("--calibrate", calibrated),
                    (f"tune (keeps {len(tuned.kept)})", tuned.conversion.to_proto()),
                ):
                    print(row(f"{name}, {fault}, {label}", model, batches[0], expected), flush=True)


if __name__ == "__main__":
    main()
