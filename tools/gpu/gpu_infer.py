"""Inference latency for ``tools/gpu/bench_gpu.py``: models converted by graphamp and by
onnxruntime's float16 tool, run on onnxruntime's CUDA provider (its CPU provider on a machine
without a GPU, where the figure only keeps the code working).

Both tools keep float32 inputs and outputs (``--keep-io-types`` and ``keep_io_types=True``), so
the same feeds, bound to the device once (I/O binding), go to the float32 model and to both
conversions; the latency is the median of ``runs`` after ``warmup`` runs.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[2]
LARGE = 1_500_000_000  # bytes: past this a converted model is saved with external data

# Per model: real-world sizes on a GPU, tiny ones elsewhere.
SIZES = {
    "full": {
        "bert-base": {
            "layers": 12,
            "hidden": 768,
            "heads": 12,
            "vocab": 30522,
            "batch": 8,
            "seq": 128,
        },
        "gpt2-kv": {
            "layers": 12,
            "hidden": 768,
            "heads": 12,
            "vocab": 50257,
            "batch": 8,
            "past": 128,
        },
        "llama-decoder": {"preset": "1b", "batch": 1, "seq": 128},
        "resnet50": {"size": "full"},
    },
    "tiny": {
        "bert-base": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 96, "batch": 2, "seq": 16},
        "gpt2-kv": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 96, "batch": 2, "past": 8},
        "llama-decoder": {"preset": "tiny", "batch": 1, "seq": 16},
        "resnet50": {"size": "small"},
    },
}
MODELS = tuple(SIZES["full"])


def _export(module: object, args: tuple, path: Path, names: dict[str, list[str]]) -> None:
    import torch

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, args, dynamo=True, opset_version=18, **names)
        program.save(str(path))


def _bert(sizes: dict, path: Path) -> dict[str, np.ndarray]:
    import torch
    import transformers

    config = transformers.BertConfig(
        vocab_size=sizes["vocab"],
        hidden_size=sizes["hidden"],
        num_hidden_layers=sizes["layers"],
        num_attention_heads=sizes["heads"],
        intermediate_size=4 * sizes["hidden"],
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(1, sizes["vocab"], (sizes["batch"], sizes["seq"]))
    _export(model, (ids,), path, {"input_names": ["input_ids"]})
    return {"input_ids": ids.numpy()}


def _gpt2_with_cache(sizes: dict, path: Path) -> dict[str, np.ndarray]:
    """One decoding step of GPT-2 with its key/value cache: a new token per sequence and
    ``past`` cached positions in, the logits and the grown cache out."""
    import torch
    import transformers

    config = transformers.GPT2Config(
        n_embd=sizes["hidden"],
        n_layer=sizes["layers"],
        n_head=sizes["heads"],
        vocab_size=sizes["vocab"],
        n_positions=1024,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    layers = sizes["layers"]

    class DecodeStep(torch.nn.Module):
        """The cache as plain tensors in and out, as a generation loop binds them."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, *past: torch.Tensor) -> tuple:
            cache = transformers.DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True)
            present = [
                t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)
            ]
            return (out.logits, *present)

    batch, heads = sizes["batch"], sizes["heads"]
    head_dim = sizes["hidden"] // heads
    ids = torch.randint(1, sizes["vocab"], (batch, 1))
    past = [torch.randn(batch, heads, sizes["past"], head_dim) for _ in range(2 * layers)]
    past_names = [f"past_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]
    present_names = [n.replace("past_", "present_") for n in past_names]
    _export(
        DecodeStep(),
        (ids, *past),
        path,
        {"input_names": ["input_ids", *past_names], "output_names": ["logits", *present_names]},
    )
    return {
        "input_ids": ids.numpy(),
        **{n: t.numpy() for n, t in zip(past_names, past, strict=True)},
    }


def _llama(sizes: dict, path: Path) -> dict[str, np.ndarray]:
    sys.path.insert(0, str(ROOT / "tools" / "bench"))
    from decoder_onnx import PRESETS, write_decoder

    config = PRESETS[sizes["preset"]]
    write_decoder(path, config)
    ids = np.random.default_rng(0).integers(1, config.vocab, (sizes["batch"], sizes["seq"]))
    return {"input_ids": ids.astype(np.int64)}


def _resnet(sizes: dict, path: Path) -> dict[str, np.ndarray]:
    """The zoo's ResNet-50 (its export fixes the batch: 8 at full size)."""
    from graphamp.models import export_onnx

    export_onnx("resnet", path, sizes["size"])
    first = onnx.load(str(path), load_external_data=False).graph.input[0]
    shape = [d.dim_value for d in first.type.tensor_type.shape.dim]
    images = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return {first.name: images}


BUILDERS: dict[str, Callable[[dict, Path], dict[str, np.ndarray]]] = {
    "bert-base": _bert,
    "gpt2-kv": _gpt2_with_cache,
    "llama-decoder": _llama,
    "resnet50": _resnet,
}


def build(name: str, scale: str, folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """The float32 model written to ``folder`` and the feeds it is timed on."""
    path = folder / f"{name}.onnx"
    return path, BUILDERS[name](SIZES[scale][name], path)


def convert_graphamp(source: Path, target: Path) -> None:
    """As a user converts: the command line (external data kept beside a large model). ``-P``:
    the current folder is not put first on the module path; on a GPU machine it is this
    checkout, whose ``graphamp/`` lacks ``passes/`` and ``models/`` (gpu_check.sh stages the
    package elsewhere), and would shadow the staged one."""
    command = [
        sys.executable,
        "-P",
        "-m",
        "graphamp.cli",
        "convert",
        str(source),
        "-o",
        str(target),
        "--keep-io-types",
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"graphamp convert failed: {done.stderr.strip()[-500:]}")


def convert_ort(source: Path, target: Path) -> None:
    """onnxruntime's float16 tool, as its documentation shows it (keep_io_types=True)."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(source)))
    model.convert_float_to_float16(keep_io_types=True)
    # the weights' bytes, not ByteSize(): protobuf cannot measure a model past 2 GB (the
    # LLaMA-shaped decoder's float32 source at the GPU's sizes)
    large = _weight_bytes(model.model.graph) > LARGE
    model.save_model_to_file(str(target), use_external_data_format=large)


def _weight_bytes(graph: onnx.GraphProto) -> int:
    """The bytes of ``graph``'s initializers, from their shapes and types."""
    return sum(
        int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        for t in graph.initializer
    )


def casts(path: Path) -> int:
    model = onnx.load(str(path), load_external_data=False)
    return sum(node.op_type == "Cast" for node in model.graph.node)


def session(path: Path, device: str, profile_prefix: str | None = None):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    options = ort.SessionOptions()
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    # use_tf32=0: the float32 model computes in float32 (onnxruntime's default runs its
    # MatMuls on TF32 tensor cores, with float16's mantissa)
    providers: list = ["CPUExecutionProvider"]
    if device == "cuda":
        providers.insert(0, ("CUDAExecutionProvider", {"use_tf32": "0"}))
    sess = ort.InferenceSession(str(path), options, providers=providers)
    if device == "cuda" and sess.get_providers()[0] != "CUDAExecutionProvider":
        # onnxruntime falls back to its CPU provider when the CUDA one fails to load (a CUDA
        # or cuDNN library it cannot find): a latency measured so is no CUDA figure
        raise RuntimeError(
            f"{path.name}: onnxruntime's CUDA provider did not load (onnxruntime's log above "
            f"says why); the session runs on {sess.get_providers()}"
        )
    return sess


def latency(path: Path, feeds: dict[str, np.ndarray], device: str, runs: int, warmup: int) -> float:
    """Median seconds per run with inputs and outputs bound on ``device``."""
    import onnxruntime as ort

    sess = session(path, device)
    binding = sess.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, device, 0))
    for output in sess.get_outputs():
        binding.bind_output(output.name, device)
    times = []
    for index in range(warmup + runs):
        start = time.perf_counter()
        sess.run_with_iobinding(binding)
        binding.synchronize_outputs()
        if index >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def profile(path: Path, feeds: dict[str, np.ndarray], device: str, runs: int = 10) -> str:
    """Where a run's time goes: onnxruntime's profile, summed per op type (Casts included)."""
    with tempfile.TemporaryDirectory() as folder:
        sess = session(path, device, profile_prefix=str(Path(folder) / "profile"))
        for _ in range(runs):
            sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
    per_op: Counter[str] = Counter()
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            per_op[event.get("args", {}).get("op_name", "?")] += int(event.get("dur", 0))
    total = sum(per_op.values()) or 1
    lines = [
        f"{op}: {us / runs / 1e3:.3f} ms a run ({us / total:.1%})"
        for op, us in per_op.most_common(12)
    ]
    return "\n".join(lines)
