"""A LLaMA-shaped decoder written to disk as ONNX, one weight at a time, as external data.

Nothing the size of the model is ever in memory: each weight is drawn, appended to the data
file and dropped, and the ModelProto holds only the graph and the offsets. The graph is a plain
opset-18 decoder: token embedding (Gather), per layer RMSNorm, q/k/v projections with grouped-
query attention (the key/value heads repeated to the query heads), rotary embedding, softmax
attention with a causal mask, the output projection, RMSNorm and a SwiGLU feed-forward network,
then a final RMSNorm and the vocabulary projection.

    from decoder_onnx import PRESETS, write_decoder
    write_decoder(Path("llama.onnx"), PRESETS["tiny"])

Used by ``tools/bench/bench_scale.py`` and by the tests (a model of a few hundred MB).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64


@dataclass(frozen=True)
class DecoderConfig:
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    max_positions: int = 2048

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def weight_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every float32 weight, in the order it is written (the graph's order)."""
        h, f, kv = self.hidden, self.ffn, self.kv_dim
        shapes: list[tuple[str, tuple[int, ...]]] = [("embed_tokens", (self.vocab, h))]
        for i in range(self.layers):
            p = f"layers.{i}."
            shapes += [
                (p + "input_norm", (h,)),
                (p + "q_proj", (h, h)),
                (p + "k_proj", (h, kv)),
                (p + "v_proj", (h, kv)),
                (p + "o_proj", (h, h)),
                (p + "post_norm", (h,)),
                (p + "gate_proj", (h, f)),
                (p + "up_proj", (h, f)),
                (p + "down_proj", (f, h)),
            ]
        shapes += [("norm", (h,)), ("lm_head", (h, self.vocab))]
        shapes += [("rope_cos", (self.max_positions, self.head_dim))]
        shapes += [("rope_sin", (self.max_positions, self.head_dim))]
        return shapes

    def parameters(self) -> int:
        return sum(int(np.prod(shape)) for _, shape in self.weight_shapes())

    def data_bytes(self) -> int:
        return 4 * self.parameters()


PRESETS = {
    # LLaMA-2-7B's shapes (32 layers, hidden 4096, FFN 11008, 32 heads, vocabulary 32000) with
    # grouped-query attention over 8 key/value heads: 5.9e9 parameters (6.7e9 with
    # --kv-heads 32, LLaMA-2-7B's own multi-head attention).
    "7b": DecoderConfig(layers=32, hidden=4096, ffn=11008, heads=32, kv_heads=8, vocab=32000),
    # TinyLlama-1.1B's shapes: 1.1e9 parameters.
    "1b": DecoderConfig(layers=22, hidden=2048, ffn=5632, heads=32, kv_heads=4, vocab=32000),
    # A smoke test: a few MB.
    "tiny": DecoderConfig(layers=2, hidden=256, ffn=688, heads=8, kv_heads=2, vocab=1000),
}


def with_overrides(config: DecoderConfig, **overrides: int | None) -> DecoderConfig:
    """``config`` with the given fields replaced (None leaves a field as it is)."""
    return dataclasses.replace(config, **{k: v for k, v in overrides.items() if v is not None})


class _ExternalWriter:
    """Appends weights to one data file and returns TensorProtos that point into it."""

    def __init__(self, data_path: Path, seed: int) -> None:
        self.data_path = data_path
        self.file = open(data_path, "wb")  # noqa: SIM115 (closed by close())
        self.offset = 0
        self.rng = np.random.default_rng(seed)

    def weight(self, name: str, shape: tuple[int, ...], kind: str = "normal") -> TensorProto:
        return self.array(name, self._values(shape, kind))

    def array(self, name: str, values: np.ndarray) -> TensorProto:
        values = np.ascontiguousarray(values, dtype=np.float32)
        values.tofile(self.file)
        tensor = TensorProto(name=name, data_type=F32, dims=list(values.shape))
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (
            ("location", self.data_path.name),
            ("offset", str(self.offset)),
            ("length", str(values.nbytes)),
        ):
            tensor.external_data.add(key=key, value=value)
        self.offset += values.nbytes
        return tensor

    def _values(self, shape: tuple[int, ...], kind: str) -> np.ndarray:
        out = np.empty(shape, np.float32)
        flat = out.reshape(-1)
        # Drawn in blocks, straight into float32: a 500 MB weight needs no float64 temporary.
        block = 1 << 22
        for start in range(0, flat.size, block):
            part = flat[start : start + block]
            self.rng.standard_normal(part.size, dtype=np.float32, out=part)
            if kind == "norm":  # RMSNorm gains near one
                part *= 0.05
                part += 1.0
            else:
                part *= 0.02
        return out

    def close(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()


def _rope_tables(config: DecoderConfig) -> tuple[np.ndarray, np.ndarray]:
    half = config.head_dim // 2
    inv = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float64) / half))
    angles = np.outer(np.arange(config.max_positions, dtype=np.float64), inv)
    angles = np.concatenate([angles, angles], axis=1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class _Graph:
    """Node building with unique names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[TensorProto] = []

    def op(self, op: str, inputs: list[str], name: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def ints(self, name: str, values: list[int]) -> str:
        self.constants.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def scalar(self, name: str, value: float) -> str:
        self.constants.append(numpy_helper.from_array(np.array(value, np.float32), name))
        return name


def _rms_norm(g: _Graph, x: str, gain: str, prefix: str) -> str:
    square = g.op("Mul", [x, x], prefix + "square")
    mean = g.op("ReduceMean", [square, "axes_last"], prefix + "mean", keepdims=1)
    shifted = g.op("Add", [mean, "eps"], prefix + "mean_eps")
    root = g.op("Sqrt", [shifted], prefix + "rms")
    normed = g.op("Div", [x, root], prefix + "normed")
    return g.op("Mul", [normed, gain], prefix + "out")


def _heads(g: _Graph, x: str, heads: int, config: DecoderConfig, prefix: str) -> str:
    """[B, S, heads * D] -> [B, heads, S, D]."""
    shape = g.ints(prefix + "shape", [0, 0, heads, config.head_dim])
    split = g.op("Reshape", [x, shape], prefix + "split")
    return g.op("Transpose", [split], prefix + "heads", perm=[0, 2, 1, 3])


def _rotary(g: _Graph, x: str, prefix: str) -> str:
    """x * cos + rotate_half(x) * sin, the tables sliced to the sequence length."""
    first = g.op("Split", [x], prefix + "halves_0", axis=-1, num_outputs=2)
    g.nodes[-1].output.append(prefix + "halves_1")
    negated = g.op("Neg", [prefix + "halves_1"], prefix + "neg")
    rotated = g.op("Concat", [negated, first], prefix + "rotated", axis=-1)
    with_cos = g.op("Mul", [x, "cos"], prefix + "cos")
    with_sin = g.op("Mul", [rotated, "sin"], prefix + "sin")
    return g.op("Add", [with_cos, with_sin], prefix + "out")


def _repeat_kv(g: _Graph, x: str, config: DecoderConfig, prefix: str) -> str:
    """[B, kv, S, D] -> [B, heads, S, D], each key/value head repeated heads/kv times."""
    groups = config.heads // config.kv_heads
    unsqueezed = g.op("Unsqueeze", [x, "axes_2"], prefix + "unsqueezed")
    shape = g.op("Shape", [unsqueezed], prefix + "shape")
    repeat = g.ints(prefix + "repeat", [1, 1, groups, 1, 1])
    target = g.op("Mul", [shape, repeat], prefix + "target")
    expanded = g.op("Expand", [unsqueezed, target], prefix + "expanded")
    heads = g.ints(prefix + "heads", [0, config.heads, -1, config.head_dim])
    return g.op("Reshape", [expanded, heads], prefix + "out")


def _attention(g: _Graph, x: str, i: int, config: DecoderConfig) -> str:
    p, w = f"layers.{i}.attn.", f"layers.{i}."
    q = _heads(g, g.op("MatMul", [x, w + "q_proj"], p + "q"), config.heads, config, p + "q_")
    k = _heads(g, g.op("MatMul", [x, w + "k_proj"], p + "k"), config.kv_heads, config, p + "k_")
    v = _heads(g, g.op("MatMul", [x, w + "v_proj"], p + "v"), config.kv_heads, config, p + "v_")
    q, k = _rotary(g, q, p + "q_rope_"), _rotary(g, k, p + "k_rope_")
    if config.kv_heads != config.heads:  # grouped-query attention
        k, v = _repeat_kv(g, k, config, p + "k_rep_"), _repeat_kv(g, v, config, p + "v_rep_")
    kt = g.op("Transpose", [k], p + "kt", perm=[0, 1, 3, 2])
    scores = g.op("MatMul", [q, kt], p + "scores")
    scaled = g.op("Mul", [scores, "attn_scale"], p + "scaled")
    masked = g.op("Add", [scaled, "causal_mask"], p + "masked")
    probs = g.op("Softmax", [masked], p + "probs", axis=-1)
    context = g.op("MatMul", [probs, v], p + "context")
    merged = g.op("Transpose", [context], p + "merged", perm=[0, 2, 1, 3])
    flat = g.op("Reshape", [merged, "hidden_shape"], p + "flat")
    return g.op("MatMul", [flat, w + "o_proj"], p + "out")


def _feed_forward(g: _Graph, x: str, i: int) -> str:
    p, w = f"layers.{i}.mlp.", f"layers.{i}."
    gate = g.op("MatMul", [x, w + "gate_proj"], p + "gate")
    silu = g.op("Mul", [gate, g.op("Sigmoid", [gate], p + "sigmoid")], p + "silu")
    up = g.op("MatMul", [x, w + "up_proj"], p + "up")
    gated = g.op("Mul", [silu, up], p + "gated")
    return g.op("MatMul", [gated, w + "down_proj"], p + "out")


def _build_graph(config: DecoderConfig) -> _Graph:
    g = _Graph()
    for name, values in (("axes_last", [-1]), ("axes_2", [2]), ("zero", [0]), ("one", [1])):
        g.ints(name, values)
    g.ints("hidden_shape", [0, 0, config.hidden])
    g.scalar("eps", 1e-5)
    g.scalar("attn_scale", 1.0 / float(np.sqrt(config.head_dim)))
    g.scalar("mask_min", -1e9)
    # Rotary tables and the causal mask, for the sequence length of the input.
    ids_shape = g.op("Shape", ["input_ids"], "ids_shape")
    length = g.op("Slice", [ids_shape, "one", g.ints("two", [2])], "seq_len")
    g.op("Slice", ["rope_cos", "zero", length], "cos")
    g.op("Slice", ["rope_sin", "zero", length], "sin")
    square = g.op("Concat", [length, length], "mask_shape", axis=0)
    one = helper.make_tensor("value", F32, [1], [1.0])
    ones = g.op("ConstantOfShape", [square], "mask_ones", value=one)
    upper = g.op("Trilu", [ones, g.ints("diagonal", [1])], "mask_upper", upper=1)
    g.op("Mul", [upper, "mask_min"], "causal_mask")
    x = g.op("Gather", ["embed_tokens", "input_ids"], "embed")
    for i in range(config.layers):
        normed = _rms_norm(g, x, f"layers.{i}.input_norm", f"layers.{i}.input_norm.")
        x = g.op("Add", [x, _attention(g, normed, i, config)], f"layers.{i}.attn_residual")
        normed = _rms_norm(g, x, f"layers.{i}.post_norm", f"layers.{i}.post_norm.")
        x = g.op("Add", [x, _feed_forward(g, normed, i)], f"layers.{i}.mlp_residual")
    final = _rms_norm(g, x, "norm", "norm.")
    g.nodes.append(helper.make_node("MatMul", [final, "lm_head"], ["logits"], name="lm_head_mm"))
    return g


def write_decoder(path: Path, config: DecoderConfig, seed: int = 0) -> Path:
    """Write the decoder to ``path`` with its weights in ``<path>.data``; returns ``path``."""
    path = Path(path)
    data_path = path.with_name(path.name + ".data")
    writer = _ExternalWriter(data_path, seed)
    try:
        cos, sin = _rope_tables(config)
        tables = {"rope_cos": cos, "rope_sin": sin}
        weights = []
        for name, shape in config.weight_shapes():
            if name in tables:
                weights.append(writer.array(name, tables[name]))
            else:
                kind = "norm" if name.endswith("norm") else "normal"
                weights.append(writer.weight(name, shape, kind))
    finally:
        writer.close()
    g = _build_graph(config)
    graph = helper.make_graph(
        g.nodes,
        "decoder",
        [helper.make_tensor_value_info("input_ids", I64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", F32, ["batch", "sequence", config.vocab])],
        weights + g.constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path
