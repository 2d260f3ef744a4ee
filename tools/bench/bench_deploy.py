"""The graphs people deploy, converted by graphamp and by the tools they would otherwise use.

    python tools/bench/bench_deploy.py [--runs 3] [--json results.json] [--gpu]

Models (small, random weights, built in code): the zoo's BERT and GPT and Hugging Face BERT
(TorchScript and dynamo exports) through onnxruntime's transformer optimizer (com.microsoft
fused ops), and Hugging Face LLaMA and Qwen2 the same way; Hugging Face LLaMA and Qwen2
(grouped-query attention), GPT-2 and ViT exported by torch.onnx at opset 18 and 23, and the
opset-18 LLaMA with two embedding channels at +-2000 (``-massive``: trained LLMs' hidden states
have such channels, which a decomposed RMSNorm squares past float16's range). Tools: graphamp
(``keep_io_types``, target cuda), onnxruntime's float16 tool
(``OnnxModel.convert_float_to_float16(keep_io_types=True)``), onnxconverter-common
(``convert_float_to_float16(keep_io_types=True)``) and, where it is installed, NVIDIA ModelOpt
AutoCast (``convert_to_mixed_precision(low_precision_type="fp16", keep_io_types=True)``, its
defaults otherwise; it pins onnx and onnxruntime versions of its own, so it may live in another
environment: ``MODELOPT_PYTHON=/path/to/python``). Per model and tool: Casts, the matrix ops
(MatMul, Gemm, attention) reading float16, the error against float32 under the faithful
evaluator (max error relative to max |y|, NaN/Inf count), whether onnxruntime loads the
output, and the conversion time (median of ``--runs``). ``--full`` adds the zoo's full-size BERT
and GPT (batch 8 x 128 tokens) through the optimizer. Mistral, Gemma-2, Phi-3 and T5 at opset
18 also go through the optimizer where it can (``-opt``), and ResNet and ViT quantized by
onnxruntime's ``quantize_static`` (QDQ, int8) at opsets 18 and 21 (``qdq-*``). ``--before REV``
adds graphamp as it was at a git revision (``graphamp convert --keep-io-types`` from a
worktree), for before/after figures. With ``--gpu`` and a CUDA device, also,
per converted model on onnxruntime's CUDA provider: the median latency, the error of the
provider's real float16 arithmetic against the float32 model (max error relative to max |y|,
NaN/Inf count) and how many nodes ran on the CPU instead (read from onnxruntime's profile: a
node without a CUDA kernel falls back silently, with copies). After the table, graphamp against
issue 28's bars per model (Casts, weight bytes, error against the other tools whose output
loads; Cast bytes against ``--before``), with the bars it misses named.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import date
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tools" / "bench")]

from benchlib import machine  # noqa: E402

import graphamp.onnx as gonnx  # noqa: E402
from graphamp.lists import matrix_ops  # noqa: E402
from graphamp.numerics import verify  # noqa: E402

MATRIX = {op.rsplit(".", 1)[-1] for op in matrix_ops("onnx")}


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


# ModelOpt pins onnx and onnxruntime versions of its own, so it lives in an environment of its
# own: MODELOPT_PYTHON names that environment's interpreter (this one if it imports modelopt).
MODELOPT_SCRIPT = """
import sys, warnings
import onnx
from modelopt.onnx.autocast import convert_to_mixed_precision
warnings.simplefilter("ignore")
model = convert_to_mixed_precision(sys.argv[1], low_precision_type="fp16", keep_io_types=True)
onnx.save(model, sys.argv[2])
"""


def modelopt_python() -> str | None:
    """The interpreter that runs ModelOpt AutoCast, or None where it is not installed: the
    environment tools/setup-modelopt.sh makes, or MODELOPT_PYTHON."""
    import importlib.util

    if os.environ.get("MODELOPT_PYTHON"):
        return os.environ["MODELOPT_PYTHON"]
    own = ROOT / ".venv-modelopt" / "bin" / "python"
    if own.exists():
        return str(own)
    return sys.executable if importlib.util.find_spec("modelopt") else None


def modelopt_tool(path: Path) -> onnx.ModelProto:
    python = modelopt_python()
    assert python is not None
    target = path.with_suffix(".modelopt.onnx")
    done = subprocess.run(
        [python, "-c", MODELOPT_SCRIPT, str(path), str(target)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise RuntimeError(lines[-1] if lines else f"exit {done.returncode}")
    return onnx.load(str(target))


def before_tool(revision: str, folder: Path) -> Callable[[Path], onnx.ModelProto]:
    """graphamp as it was at ``revision`` (a git worktree in ``folder``), run as users run it:
    ``graphamp convert IN -o OUT --keep-io-types`` in a process of its own."""
    sys.path.insert(0, str(ROOT / "tools" / "ci"))  # (same_outputs.py lives there)
    from same_outputs import RUNNER, worktree

    tree = worktree(revision, folder)

    def convert(path: Path) -> onnx.ModelProto:
        target = path.with_suffix(".before.onnx")
        command = [sys.executable, "-c", RUNNER, str(tree), "convert", str(path)]
        done = subprocess.run(
            [*command, "-o", str(target), "--keep-io-types"], capture_output=True, text=True
        )
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            raise RuntimeError(lines[-1] if lines else f"exit {done.returncode}")
        return onnx.load(str(target))

    return convert


TOOLS: dict[str, Callable[[Path], onnx.ModelProto]] = {
    "graphamp": graphamp_tool,
    "onnxruntime float16": ort_tool,
    "onnxconverter-common": occ_tool,
}
if modelopt_python() is not None:
    TOOLS["ModelOpt AutoCast"] = modelopt_tool


def optimized_full(name: str, folder: Path) -> Path:
    """The zoo's full-size ``name`` through onnxruntime's optimizer (BERT fusions)."""
    from onnxruntime.transformers.optimizer import optimize_model

    from graphamp.models import export_onnx

    source, target = folder / f"zoo-{name}-full.onnx", folder / f"zoo-{name}-full.opt.onnx"
    export_onnx(name, source, "full")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimize_model(
            str(source), model_type="bert", num_heads=12, hidden_size=768
        ).save_model_to_file(str(target))
    return target


def build_models(folder: Path, full: bool = False, only: set[str] | None = None) -> dict[str, Path]:
    """Every model of the module docstring (those named in ``only``), written to ``folder``."""
    import torch

    from tests.hf_models import hf_model
    from tests.onnx.test_ort_fused import CASES, optimized

    wanted = (lambda name: name in only) if only else (lambda name: True)
    Logits = _logits()
    models = {case: optimized(case, folder) for case in CASES if wanted(case)}
    if full:
        names = [n for n in ("bert", "gpt") if wanted(f"zoo-{n}-full")]
        models.update({f"zoo-{n}-full": optimized_full(n, folder) for n in names})
    ids = torch.randint(1, 96, (1, 8), generator=torch.Generator().manual_seed(0))
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for name, opsets in EXPORTS.items():
        for opset in opsets:
            path = folder / f"hf-{name}-opset{opset}.onnx"
            if not wanted(path.stem):
                continue
            model = hf_model(name, lm_head=name != "vit")
            # TorchScript takes tensors out, and T5 two inputs: a wrapper gives the logits
            module = Logits(model) if opset == 17 or name == "t5" else model
            args = (ids, ids) if name == "t5" else (pixels if name == "vit" else ids,)
            try:
                with warnings.catch_warnings(), torch.no_grad():
                    warnings.simplefilter("ignore")
                    if opset == 17:  # the TorchScript exporter: dynamo writes 18 and later
                        torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17)
                    else:
                        torch.onnx.export(module, args, dynamo=True, opset_version=opset).save(
                            str(path)
                        )
            except Exception as exc:  # the exporter's own limits (aten::diff at opset 17)
                print(
                    f"# {path.stem}: the exporter cannot ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0][:100]})"
                )
                continue
            models[path.stem] = path
    if "hf-llama-opset18" in models and wanted("hf-llama-opset18-massive"):
        models["hf-llama-opset18-massive"] = massive(models["hf-llama-opset18"])
    for name, model_type in OPTIMIZED.items():
        source = models.get(f"hf-{name}-opset18")
        if source is not None and wanted(f"hf-{name}-opset18-opt"):
            found = through_optimizer(source, model_type)
            if found is not None:
                models[f"hf-{name}-opset18-opt"] = found
    from tests.onnx.qdq_models import QDQ_MODELS, qdq_model

    for name in QDQ_MODELS:
        for opset in (18, 21):
            if wanted(f"qdq-{name}-opset{opset}"):
                models[f"qdq-{name}-opset{opset}"] = qdq_model(name, folder / "qdq", opset)
    return models


# The exports that also go through onnxruntime's transformer optimizer (its model type).
OPTIMIZED = {"mistral": "gpt2", "gemma2": "gpt2", "phi3": "gpt2", "t5": "t5"}


def through_optimizer(source: Path, model_type: str) -> Path | None:
    """``source`` through onnxruntime's transformer optimizer; None (said) where it fails or
    writes a model onnxruntime refuses."""
    from onnxruntime.transformers.optimizer import optimize_model

    target = source.with_name(f"{source.stem}-opt.onnx")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optimize_model(
                str(source), model_type=model_type, num_heads=4, hidden_size=64
            ).save_model_to_file(str(target))
    except Exception as exc:  # the optimizer's own limits are a result
        print(f"# {target.stem}: the optimizer cannot ({type(exc).__name__}: {exc})"[:160])
        return None
    if not loads(onnx.load(str(target))):
        print(f"# {target.stem}: onnxruntime refuses the optimizer's output")
        return None
    return target


# Hugging Face models exported by torch.onnx, by opset (17: TorchScript, where it can).
EXPORTS = {
    "llama": (17, 18, 23),
    "qwen2": (18, 23),
    "mistral": (17, 18, 23),
    "gemma2": (17, 18, 23),
    "phi3": (17, 18, 23),
    "t5": (17, 18, 23),
    "gpt2": (18, 23),
    "vit": (18, 23),
}


def _logits():
    import torch

    class Logits(torch.nn.Module):
        """Positional token ids (and a T5's decoder ids) -> logits."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids, decoder_ids=None):  # type: ignore[no-untyped-def]
            if decoder_ids is None:
                return self.model(input_ids=ids).logits
            return self.model(input_ids=ids, decoder_input_ids=decoder_ids).logits

    return Logits


def massive(path: Path) -> Path:
    """``path``'s LLaMA with two embedding channels at +-2000, as the "massive activations" of
    trained LLMs: a decomposed RMSNorm squares them past float16's range."""
    import numpy as np
    from onnx import numpy_helper

    model = onnx.load(str(path))
    for init in model.graph.initializer:
        if init.name == "model.embed_tokens.weight":
            table = numpy_helper.to_array(init).copy()
            table[:, :2] = 2000.0 * np.sign(table[:, :2])
            init.CopyFrom(numpy_helper.from_array(table, init.name))
    target = path.with_name(f"{path.stem}-massive.onnx")
    onnx.save(model, str(target))
    return target


def matrix_low(proto: onnx.ModelProto) -> tuple[int, int]:
    """(matrix ops whose first input is float16, matrix ops)."""
    types = gonnx.inferred_types(proto)
    ops = [n for n in proto.graph.node if n.op_type in MATRIX]
    low = sum(types.get(n.input[0]) == onnx.TensorProto.FLOAT16 for n in ops)
    return low, len(ops)


def weight_bytes(proto: onnx.ModelProto) -> int:
    """Bytes of the stored values: initializers and Constant nodes' tensors."""
    from onnx import numpy_helper

    stored = list(proto.graph.initializer) + [
        a.t for n in proto.graph.node if n.op_type == "Constant" for a in n.attribute if a.t.dims
    ]
    return sum(numpy_helper.to_array(t).nbytes for t in stored)


def cast_bytes(proto: onnx.ModelProto) -> int | None:
    """Bytes the Casts read and write per run, from ONNX shape inference (a symbolic dimension
    counts 1: the models are exported at batch 1); None where a Cast's shape is unknown."""
    import numpy as np
    from onnx import helper

    inferred = onnx.shape_inference.infer_shapes(proto)
    values = {
        v.name: v.type.tensor_type
        for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    }
    total = 0
    for node in proto.graph.node:
        if node.op_type != "Cast":
            continue
        source, target = values.get(node.input[0]), values.get(node.output[0])
        if source is None or target is None or not source.HasField("shape"):
            return None
        elements = int(np.prod([d.dim_value or 1 for d in source.shape.dim]))
        sizes = [
            np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).itemsize
            for t in (source, target)
        ]
        total += elements * sum(sizes)
    return total


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
        "weight_bytes": weight_bytes(converted),
        "cast_bytes": cast_bytes(converted),
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
            row.update(cuda_run(original, converted, feeds))
    return row


def cuda_run(
    original: onnx.ModelProto, proto: onnx.ModelProto, feeds: dict[str, object]
) -> dict[str, object]:
    """Latency, error and CPU-placed nodes of ``proto`` on onnxruntime's CUDA provider."""
    import numpy as np
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return {}
    from benchlib import median_time

    from graphamp.onnx.numerics.runtime import _typed_feeds

    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    reference = ort.InferenceSession(
        original.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, _typed_feeds(original, feeds))
    typed = _typed_feeds(proto, feeds)
    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "profile")
        profiled = ort.InferenceSession(proto.SerializeToString(), options, providers=providers)
        if "CUDAExecutionProvider" not in profiled.get_providers():
            return {}  # onnxruntime-gpu without a usable GPU falls back to the CPU
        outputs = profiled.run(None, typed)
        events = json.loads(Path(profiled.end_profiling()).read_text())
    on_cpu = {
        e["name"]
        for e in events
        if e.get("cat") == "Node" and e.get("args", {}).get("provider") == "CPUExecutionProvider"
    }
    # Inputs and outputs stay on the GPU: a model's logits copied to the host would be timed
    # instead of its kernels (a large model's logits are hundreds of megabytes).
    session = ort.InferenceSession(proto.SerializeToString(), providers=providers)
    binding = session.io_binding()
    for name, value in typed.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
    for output in session.get_outputs():
        binding.bind_output(output.name, "cuda")

    def run() -> None:
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()

    seconds, _ = median_time(run, 100, warmup=20)
    errors, bad = [], 0
    for got, want in zip(outputs, reference, strict=True):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        bad += int((~np.isfinite(got)).sum())
        scale = max(float(np.abs(want).max()), 1e-30)
        finite = np.isfinite(got)
        errors.append(float(np.abs(got - want)[finite].max(initial=0.0)) / scale)
    return {
        "cuda_ms": seconds * 1e3,
        "cuda_error": max(errors),
        "cuda_nan_inf": bad,
        "cuda_cpu_nodes": len(on_cpu),
    }


def markdown(results: dict[str, dict[str, dict[str, object]]]) -> str:
    gpu = any("cuda_ms" in row for tools in results.values() for row in tools.values())
    lines = [
        "| model | tool | Casts | Cast bytes | weight bytes | matrix ops in float16 | "
        "max rel error | NaN/Inf | loads | convert s |"
        + (" CUDA ms | CUDA error | CUDA NaN/Inf | nodes on CPU |" if gpu else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|" if gpu else ""),
    ]
    for model, tools in results.items():
        for tool, row in tools.items():
            if "failed" in row:
                lines.append(f"| {model} | {tool} | failed: {row['failed']} ||||||||")
                continue
            error = row.get("max_rel_error")
            lines.append(
                f"| {model} | {tool} | {row['casts']} | {_or_dash(row.get('cast_bytes'))} | "
                f"{row['weight_bytes']} | {row['matrix_low']} | "
                f"{'-' if error is None else f'{error:.2e}'} | {row.get('nan_inf', '-')} | "
                f"{'yes' if row['loads'] else 'NO'} | {row['convert_s']:.2f} |"
                + (cuda_cells(row) if gpu else "")
            )
    return "\n".join(lines)


def bars(results: dict[str, dict[str, dict[str, object]]]) -> str:
    """graphamp against the bars it is held to, per model, from the other tools whose output loads:
    Casts <= the fewest + 1, weight bytes <= the fewest x 1.01, max rel error <=
    max(1.25 x the lowest, 2e-3), and Cast bytes <= a ``--before`` revision's."""
    lines = [
        "| model | Casts (best other) | weight bytes / best other | error (bar) | "
        "Cast bytes (before) | bars missed |",
        "|---|---|---|---|---|---|",
    ]
    for model, tools in results.items():
        ours = tools.get("graphamp", {})
        if "failed" in ours:
            lines.append(f"| {model} | graphamp failed: {ours['failed']} |||||")
            continue
        others = [
            row
            for tool, row in tools.items()
            if not tool.startswith("graphamp") and "failed" not in row and row["loads"]
        ]
        before = next((r for t, r in tools.items() if t.startswith("graphamp ")), None)
        missed, cells = [], [model]
        if others:
            fewest = min(_number(r, "casts") for r in others)
            ratio = _number(ours, "weight_bytes") / min(_number(r, "weight_bytes") for r in others)
            errors = [_number(r, "max_rel_error") for r in others if "max_rel_error" in r]
            bar = max(1.25 * min(errors), 2e-3) if errors else None
            error = _number(ours, "max_rel_error") if "max_rel_error" in ours else None
            cells += [f"{ours['casts']} ({fewest:.0f})", f"x{ratio:.4f}"]
            cells.append("-" if error is None or bar is None else f"{error:.2e} ({bar:.2e})")
            missed += ["Casts"] if _number(ours, "casts") > fewest + 1 else []
            missed += ["weight bytes"] if ratio > 1.01 else []
            missed += ["error"] if error is not None and bar is not None and error > bar else []
        else:
            cells += ["- (no other valid)", "-", "-"]
        if before is not None and "failed" not in before:
            ours_bytes, their_bytes = ours.get("cast_bytes"), before.get("cast_bytes")
            cells.append(f"{_or_dash(ours_bytes)} ({_or_dash(their_bytes)})")
            if _number(ours, "cast_bytes") > _number(before, "cast_bytes"):
                missed.append("Cast bytes")
        else:
            cells.append("-")
        cells.append(", ".join(missed) or "none")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _number(row: dict[str, object], key: str) -> float:
    value = row.get(key)
    return float(value) if isinstance(value, int | float) else 0.0


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def cuda_cells(row: dict[str, object]) -> str:
    if "cuda_ms" not in row:
        return " - | - | - | - |"
    return (
        f" {row['cuda_ms']:.3f} | {row['cuda_error']:.2e} | {row['cuda_nan_inf']} | "
        f"{row['cuda_cpu_nodes']} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="conversions timed per tool (median)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--gpu", action="store_true", help="also run each output on onnxruntime's CUDA provider"
    )
    parser.add_argument(
        "--full", action="store_true", help="add the zoo's full-size BERT and GPT (optimized)"
    )
    parser.add_argument(
        "--models", nargs="+", metavar="NAME", help="only these models (names as in the table)"
    )
    parser.add_argument(
        "--before",
        metavar="REV",
        help="also graphamp as it was at git revision REV (a worktree under bench-out/)",
    )
    args = parser.parse_args()
    print(f"# {date.today()} · {machine()}")
    if args.before:
        label = f"graphamp {args.before[:7]}"
        TOOLS[label] = before_tool(args.before, ROOT / "bench-out" / f"before-{args.before}")
    with tempfile.TemporaryDirectory() as folder:
        models = build_models(Path(folder), args.full, set(args.models or ()))
        results = {
            name: {tool: measure(path, tool, args.runs, args.gpu) for tool in TOOLS}
            for name, path in models.items()
        }
    print(markdown(results))
    print()
    print(bars(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
