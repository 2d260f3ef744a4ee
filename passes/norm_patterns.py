"""The decomposed normalisations exporters write, matched in an OpGraph (used by
:mod:`fuse_norms`; helpers, not a pass).

An RMSNorm (LLaMA, Mistral, Gemma, Phi-3, T5 below opset 23)::

    p = Pow(x, 2)  or  Mul(x, x)
    m = ReduceMean(p) over the last axis, dims kept
    a = Add(m, eps)                      (eps a stored scalar, either side)
    s = Sqrt(a)
    n = Mul(x, Reciprocal(s))  or  Mul(x, Div(1, s))  or  Div(x, s)
    y = Mul(n, w)  or  Mul(w, n)         (w one value per channel: x's last dimension)

A LayerNorm (torch.onnx's TorchScript exporter below opset 17, hand-written norms)::

    m = ReduceMean(x) over the last axis, dims kept
    d = Sub(x, m)                        (read only by the norm's own ops)
    p = Pow(d, 2)  or  Mul(d, d);  v = ReduceMean(p) over the last axis
    s = Sqrt(Add(v, eps))
    n = Div(d, s)  or  Mul(d, Reciprocal(s))
    y = Mul(n, w)  [then Add(y, b)]      (w, b one value per channel, either side)

Every intermediate value has one reader and is no graph output, the shapes are known (a mean
keeps every dimension but the last), the exponent is 2 and the constants are stored scalars.
x may be the model's own Cast: of a value of x's type (T5's ``.to(float32)`` on a float32
model), or of a float16/bfloat16 value of the weight's type with the normalised value cast
back to that type before the weight (a model exported in half precision: LLaMA's RMSNorm
computes in float32 between two Casts); the fused op then reads that value, in the weight's
type, and the Casts go with the pattern.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from graphamp.core.graph import NodeKind, OpGraph, OpNode


@dataclass
class NormMatch:
    """A decomposed norm: ``kind`` ("rms_norm", "layer_norm"), what the fused op reads (x,
    the scale, a bias), its epsilon, and the model's nodes it replaces."""

    kind: str
    x: str
    scale: str
    epsilon: float
    nodes: list[str]
    bias: str | None = None
    inputs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.inputs = [self.x, self.scale, *([self.bias] if self.bias else [])]


def match_rms_norm(graph: OpGraph, final: OpNode) -> NormMatch | None:
    """The RMSNorm ending at ``final`` (the Mul by the weight, on either side), or None."""
    if final.op != "Mul" or final.domain or len(final.inputs) != 2:
        return None
    for normed, scale in (final.inputs, final.inputs[::-1]):
        if scale not in graph.tensors:
            continue
        back = _cast_back(graph, normed, scale)
        found = _normalised(graph, back.inputs[0] if back is not None else normed)
        if found is None:
            continue
        x, epsilon, nodes = found
        nodes = [*nodes, *([back.name] if back is not None else []), final.name]
        x, nodes = _through_model_cast(graph, x, nodes, graph.tensors[scale].dtype)
        if not _per_channel(graph, x, scale, final.outputs[0]):
            return None
        return NormMatch("rms_norm", x, scale, epsilon, nodes)
    return None


def match_layer_norm(graph: OpGraph, final: OpNode) -> NormMatch | None:
    """The LayerNorm ending at ``final``: the Add of its bias, or (with no bias) the Mul by
    its weight; None where it is not one."""
    if final.domain or len(final.inputs) != 2 or final.op not in ("Add", "Mul"):
        return None
    bias, tail, mul = None, [final.name], final
    if final.op == "Add":
        for scaled, candidate in (final.inputs, final.inputs[::-1]):
            producer = only_producer(graph, scaled)
            if producer is not None and producer.op == "Mul" and len(producer.inputs) == 2:
                bias, tail, mul = candidate, [producer.name, final.name], producer
                break
        else:
            return None
    for normed, scale in (mul.inputs, mul.inputs[::-1]):
        if scale not in graph.tensors:
            continue
        back = _cast_back(graph, normed, scale)
        found = _normalised(graph, back.inputs[0] if back is not None else normed)
        centred = _centred(graph, found[0], found[2]) if found is not None else None
        if found is None or centred is None:
            continue
        x, head = centred
        nodes = [*head, *found[2], *([back.name] if back is not None else []), *tail]
        x, nodes = _through_model_cast(graph, x, nodes, graph.tensors[scale].dtype)
        if not _per_channel(graph, x, scale, final.outputs[0]):
            return None
        if bias is not None and not _per_channel(graph, x, bias, final.outputs[0]):
            return None
        return NormMatch("layer_norm", x, scale, found[1], nodes, bias)
    return None


def _centred(graph: OpGraph, d: str, inner: list[str]) -> tuple[str, list[str]] | None:
    """(x, [the mean's node, the Sub]) when ``d`` is x - mean(x) over the last axis and only
    ``inner`` (the norm's own ops) read it."""
    tensor = graph.tensors.get(d)
    if tensor is None:
        return None
    sub = graph.nodes.get(tensor.producer or "")
    if sub is None or sub.op != "Sub" or sub.domain or tensor.is_graph_output:
        return None
    x, centre = sub.inputs
    mean = only_producer(graph, centre)
    if mean is None or mean.op != "ReduceMean" or mean.inputs[0] != x:
        return None
    if not _last_axis_mean(graph, mean):
        return None
    if any(reader not in inner for reader, _ in graph.consumers(d)):
        return None
    return x, [mean.name, sub.name]


def _per_channel(graph: OpGraph, x: str, weight: str, output: str) -> bool:
    """``weight`` holds one value per channel (x's last dimension) in x's type, and the
    norm's output has x's shape."""
    x_shape = graph.tensors[x].shape
    info = graph.tensors.get(weight)
    if info is None or not x_shape:
        return False
    return (
        info.dtype == graph.tensors[x].dtype
        and isinstance(x_shape[-1], int)
        and info.shape == (x_shape[-1],)
        and graph.tensors[output].shape == x_shape
    )


def _cast_back(graph: OpGraph, value: str, weight: str) -> OpNode | None:
    """The model's Cast producing ``value`` (read only by the weight's Mul) where it takes the
    float32 normalised value to the weight's type: a narrowing one (a half-precision export),
    or one from float32 to float32 (torch.onnx's TorchScript exporter writes LLaMA's
    ``.to(input_dtype)`` so in a float32 model: unmatched, the first conversion made it a
    narrowing Cast that a second conversion matched, and converting again was no fixed
    point); else None."""
    tensor = graph.tensors.get(value)
    if tensor is None or tensor.producer is None or len(graph.consumers(value)) != 1:
        return None
    cast = graph.nodes[tensor.producer]
    if cast.kind is not NodeKind.CAST or not cast.inputs or not cast.inputs[0]:
        return None
    if cast.cast_to != graph.tensors[weight].dtype or tensor.is_graph_output:
        return None
    source = graph.tensors[cast.inputs[0]]
    return cast if source.dtype == "float32" else None


def _through_model_cast(
    graph: OpGraph, x: str, nodes: list[str], dtype: str
) -> tuple[str, list[str]]:
    """Where x is the model's own Cast of a value of type ``dtype`` (the weight's: T5's
    ``hidden_states.to(torch.float32)`` on a float32 model, LLaMA's on a float16 one), the
    fused op reads that value: the Cast would keep the norm's input float32 whatever runs
    before it. The Cast goes too when the pattern was its only reader."""
    producer = graph.tensors[x].producer
    cast = graph.nodes[producer] if producer is not None else None
    if cast is None or cast.kind is not NodeKind.CAST or not cast.inputs or not cast.inputs[0]:
        return x, nodes
    source = graph.tensors.get(cast.inputs[0])
    if source is None or source.dtype != dtype:
        return x, nodes
    readers = {name for name, _ in graph.consumers(x)}
    if readers <= set(nodes) and not graph.tensors[x].is_graph_output:
        nodes = [cast.name, *nodes]
    return source.name, nodes


def _normalised(graph: OpGraph, value: str) -> tuple[str, float, list[str]] | None:
    """(x, eps, the nodes in graph order) when ``value`` is x / sqrt(mean(x**2) + eps)."""
    node = only_producer(graph, value)
    if node is None or node.op not in ("Mul", "Div") or len(node.inputs) != 2:
        return None
    if node.op == "Div":
        x, root_value = node.inputs
        inverse: list[str] = []
    else:
        for candidate, other in (node.inputs, node.inputs[::-1]):
            inv = only_producer(graph, other)
            if inv is not None and inv.op == "Reciprocal":
                x, root_value, inverse = candidate, inv.inputs[0], [inv.name]
                break
            if inv is not None and inv.op == "Div" and scalar(graph, inv.inputs[0]) == 1.0:
                x, root_value, inverse = candidate, inv.inputs[1], [inv.name]
                break
        else:
            return None
    root = only_producer(graph, root_value)
    if root is None or root.op != "Sqrt":
        return None
    add = only_producer(graph, root.inputs[0])
    if add is None or add.op != "Add" or len(add.inputs) != 2:
        return None
    for mean_value, eps_value in (add.inputs, add.inputs[::-1]):
        epsilon = scalar(graph, eps_value)
        mean = only_producer(graph, mean_value)
        if epsilon is not None and mean is not None and mean.op == "ReduceMean":
            break
    else:
        return None
    if not (0 < epsilon < 1) or not _last_axis_mean(graph, mean):
        return None
    square = only_producer(graph, mean.inputs[0])
    if square is None or not _squares(graph, square, x):
        return None
    nodes = [square.name, mean.name, add.name, root.name, *inverse, node.name]
    return x, epsilon, nodes


def only_producer(graph: OpGraph, value: str) -> OpNode | None:
    """The plain op producing ``value`` when it is that value's only reader's input: one
    reader, no graph output."""
    tensor = graph.tensors.get(value)
    if tensor is None or tensor.producer is None or tensor.is_graph_output:
        return None
    if len(graph.consumers(value)) != 1:
        return None
    node = graph.nodes[tensor.producer]
    return None if node.domain or len(node.outputs) != 1 else node


def _squares(graph: OpGraph, node: OpNode, x: str) -> bool:
    if node.op == "Mul":
        return node.inputs == [x, x]
    return node.op == "Pow" and node.inputs[0] == x and scalar(graph, node.inputs[1]) == 2.0


def _last_axis_mean(graph: OpGraph, mean: OpNode) -> bool:
    """The mean keeps every dimension of its input and reduces the last to 1 (read from the
    shapes, which say it whatever the opset writes the axes as)."""
    before = graph.tensors[mean.inputs[0]].shape
    after = graph.tensors[mean.outputs[0]].shape
    return (
        before is not None
        and after is not None
        and len(before) == len(after) >= 1
        and after[-1] == 1
        and before[-1] != 1
        and before[:-1] == after[:-1]
    )


def scalar(graph: OpGraph, name: str) -> float | None:
    """The value of a stored one-element float value (not an overridable input), or None."""
    tensor = graph.tensors.get(name)
    if tensor is None or not tensor.is_constant or tensor.is_graph_input:
        return None
    values = np.asarray(tensor.stored_value())
    if values.size != 1 or not np.issubdtype(values.dtype, np.floating):
        return None
    value = float(values.reshape(-1)[0])
    return value if math.isfinite(value) else None
