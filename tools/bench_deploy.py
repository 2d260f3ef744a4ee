"""The graphs people deploy, converted by graphamp and by the tools they would otherwise use.

    python tools/bench_deploy.py [--runs 3] [--json results.json] [--gpu]

Models (small, random weights, built in code): the zoo's BERT and GPT and Hugging Face BERT
(TorchScript and dynamo exports) through onnxruntime's transformer optimizer (com.microsoft
fused ops); Hugging Face LLaMA and Qwen2 (grouped-query attention), GPT-2 and ViT exported by
torch.onnx at opset 18 and 23. Tools: graphamp (``keep_io_types``, target cuda),
onnxruntime's float16 tool (``OnnxModel.convert_float_to_float16(keep_io_types=True)``) and
onnxconverter-common
(``convert_float_to_float16(keep_io_types=True)``). Per model and tool: Casts, the matrix ops
(MatMul, Gemm, attention) reading float16, the error against float32 under the faithful
evaluator (max error relative to max |y|, NaN/Inf count), whether onnxruntime loads the
output, and the conversion time (median of ``--runs``). With ``--gpu`` and a CUDA device, also
onnxruntime CUDA latency of each converted model.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import date
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

from benchlib import machine  # noqa: E402

import graphamp.onnx as gonnx  # noqa: E402
from graphamp import verify  # noqa: E402
from graphamp.dialects.registry import ONNX_MATRIX_OPS  # noqa: E402

MATRIX = {op.rsplit(".", 1)[-1] for op in ONNX_MATRIX_OPS}


def graphamp_tool(path: Path) -> onnx.ModelProto:
    return gonnx.convert(path, keep_io_types=True).to_proto()


def ort_tool(path: Path) -> onnx.ModelProto:
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(path)))
    model.convert_float_to_float16(keep_io_types=True)
    return model.model


def occ_tool(path: Path) -> onnx.ModelProto:
    from onnxconverter_common import float16

    return float16.convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)


TOOLS: dict[str, Callable[[Path], onnx.ModelProto]] = {
    "graphamp": graphamp_tool,
    "onnxruntime float16": ort_tool,
    "onnxconverter-common": occ_tool,
}


def build_models(folder: Path) -> dict[str, Path]:
    """Every model of the module docstring, written to ``folder``."""
    import torch

    from tests.hf_models import hf_model
    from tests.test_ort_fused import CASES, optimized

    models = {case: optimized(case, folder) for case in CASES}
    ids = torch.randint(1, 96, (1, 8), generator=torch.Generator().manual_seed(0))
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for name in ("llama", "qwen2", "gpt2", "vit"):
        for opset in (18, 23):
            path = folder / f"hf-{name}-opset{opset}.onnx"
            model = hf_model(name, lm_head=name != "vit")
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                torch.onnx.export(
                    model, (pixels if name == "vit" else ids,), dynamo=True, opset_version=opset
                ).save(str(path))
            models[path.stem] = path
    return models


def matrix_low(proto: onnx.ModelProto) -> tuple[int, int]:
    """(matrix ops whose first input is float16, matrix ops)."""
    types = gonnx.inferred_types(proto)
    ops = [n for n in proto.graph.node if n.op_type in MATRIX]
    low = sum(types.get(n.input[0]) == onnx.TensorProto.FLOAT16 for n in ops)
    return low, len(ops)


def loads(proto: onnx.ModelProto) -> bool:
    import onnxruntime as ort

    try:
        ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime's own error types
        return False
    return True


def measure(path: Path, tool: str, runs: int, gpu: bool) -> dict[str, object]:
    convert = TOOLS[tool]
    times, converted = [], None
    for _ in range(runs):
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                converted = convert(path)
        except Exception as exc:  # another tool's failure is a result, not a crash
            return {"failed": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
        times.append(time.perf_counter() - start)
    assert converted is not None
    original = onnx.load(str(path))
    low, total = matrix_low(converted)
    row: dict[str, object] = {
        "casts": sum(n.op_type == "Cast" for n in converted.graph.node),
        "matrix_low": f"{low}/{total}",
        "convert_s": sorted(times)[len(times) // 2],
        "loads": loads(converted),
    }
    if row["loads"]:
        feeds = verify.random_inputs(original, seed=1)
        report = verify.verify(original, converted, feeds, rtol=1e-2)
        row["max_rel_error"] = max(o.max_rel_error for o in report.outputs)
        row["nan_inf"] = sum(o.nan_inf for o in report.outputs)
        if gpu:
            row["cuda_ms"] = cuda_latency(converted, feeds)
    return row


def cuda_latency(proto: onnx.ModelProto, feeds: dict[str, object]) -> float | None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None
    from benchlib import median_time

    from graphamp.onnx.runtime import _typed_feeds

    session = ort.InferenceSession(proto.SerializeToString(), providers=["CUDAExecutionProvider"])
    typed = _typed_feeds(proto, feeds)
    seconds, _ = median_time(lambda: session.run(None, typed), 20, warmup=5)
    return seconds * 1e3


def markdown(results: dict[str, dict[str, dict[str, object]]]) -> str:
    lines = [
        "| model | tool | Casts | matrix ops in float16 | max rel error | NaN/Inf | loads | "
        "convert s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, tools in results.items():
        for tool, row in tools.items():
            if "failed" in row:
                lines.append(f"| {model} | {tool} | failed: {row['failed']} ||||||")
                continue
            error = row.get("max_rel_error")
            lines.append(
                f"| {model} | {tool} | {row['casts']} | {row['matrix_low']} | "
                f"{'-' if error is None else f'{error:.2e}'} | {row.get('nan_inf', '-')} | "
                f"{'yes' if row['loads'] else 'NO'} | {row['convert_s']:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="conversions timed per tool (median)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--gpu", action="store_true", help="also time onnxruntime CUDA latency")
    args = parser.parse_args()
    print(f"# {date.today()} · {machine()}")
    with tempfile.TemporaryDirectory() as folder:
        models = build_models(Path(folder))
        results = {
            name: {tool: measure(path, tool, args.runs, args.gpu) for tool in TOOLS}
            for name, path in models.items()
        }
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
