"""A float8 model whose float8 choices are inputs: one session for every set ``tune --fp8``
tries.

Float8's quantisers and float8 weights are edits of the converted model, not a rounding the
plain switchable model (:mod:`graphamp.onnx.numerics.switchable`) can switch. This model is
built once from the conversion with every candidate in float8: each operand slot of a candidate
reads ``Where(flag, float8 path, low path)``, where the float8 path is what the conversion
wrote (``QuantizeLinear -> DequantizeLinear`` of an activation, ``DequantizeLinear`` of a
float8 weight) and the low path what the conversion without float8 there reads (the
activation as it is, the weight rounded to the low type from the float32 model's, or with
``kept_int8`` its int8 copy through a DequantizeLinear, as a kept product reads it). With a
flag off the product computes what the plain low-type conversion computes; with it on, what
the float8 conversion computes. It runs as the faithful evaluator runs the converted model
(:func:`graphamp.onnx.numerics.emulate.emulated`, quantisers op by op), so a set evaluates in
one run per batch: no conversion, emulation or session per trial.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from graphamp.core.dtypes import numpy_type
from graphamp.core.graph import OpGraph, unique_name
from graphamp.errors import InternalError
from graphamp.onnx.io.files import inferred_types
from graphamp.onnx.numerics.emulate import emulated
from graphamp.onnx.numerics.session import Session, Weights
from graphamp.onnx.numerics.statgraph import node_names
from graphamp.passes.numerics import to_target_limit

FLAG = "graphamp.fp8/"
# Quantisers run op by op, as the faithful evaluator runs a Q/DQ model (runtime.runner)
_OP_BY_OP = ort.GraphOptimizationLevel.ORT_DISABLE_ALL


class Fp8Switchable:
    """The float8 conversion ``converted`` (every candidate in float8) with a flag per
    candidate; ``source`` is the float32 model it was converted from, ``graph`` graphamp's
    reading of it (the candidates' operand slots)."""

    def __init__(
        self,
        converted: onnx.ModelProto,
        source: onnx.ModelProto,
        graph: OpGraph,
        candidates: Iterable[str],
        dtype: str,
        *,
        kept_int8: bool = False,
    ) -> None:
        self.candidates = list(candidates)
        self.weights = Weights()
        switchable = _build(converted, source, graph, self.candidates, dtype, kept_int8)
        types = inferred_types(switchable)
        self._session = Session(
            emulated(switchable, types, self.weights), what="the float8 switchable model",
            level=_OP_BY_OP, weights=self.weights,
        )  # fmt: skip
        self.outputs = [o.name for o in converted.graph.output]
        self.runs = 0  # batches run so far

    def flags(self, float8: Iterable[str]) -> dict[str, np.ndarray]:
        chosen = set(float8)
        return {f"{FLAG}{name}": np.array(name in chosen) for name in self.candidates}

    def run(self, feeds: dict[str, np.ndarray], float8: Iterable[str]) -> dict[str, np.ndarray]:
        """The graph outputs on ``feeds`` with the candidates ``float8`` in float8 and the
        other candidates in the low type."""
        self.runs += 1
        return self._session.run({**feeds, **self.flags(float8)}, self.outputs)


def _build(
    converted: onnx.ModelProto,
    source: onnx.ModelProto,
    graph: OpGraph,
    candidates: list[str],
    dtype: str,
    kept_int8: bool,
) -> onnx.ModelProto:
    """``converted`` with a ``Where`` before each operand slot of each candidate."""
    model = onnx.ModelProto()
    model.CopyFrom(converted)
    main = model.graph
    by_name = dict(zip(node_names(main), main.node, strict=True))
    producer = {out: node for node in main.node for out in node.output}
    stored = {init.name: init for init in main.initializer}
    originals = {init.name: init for init in source.graph.initializer}
    taken = {n for node in main.node for n in (*node.input, *node.output)} | set(stored)
    taken |= set(by_name)
    low_weights: dict[str, str] = {}  # the float32 model's weight -> its low copy
    added: dict[int, list[onnx.NodeProto]] = {}  # id of a node -> nodes to put before it
    for name in candidates:
        node = by_name.get(name)
        dims = graph.nodes[name].matrix if name in graph.nodes else None
        if node is None or dims is None:
            raise InternalError(f"tune --fp8: float8 node {name!r} is not in the conversion")
        flag = f"{FLAG}{name}"
        main.input.append(helper.make_tensor_value_info(flag, onnx.TensorProto.BOOL, []))
        for slot in (dims.a, dims.b):
            value = node.input[slot]
            dq = producer.get(value)
            if dq is None or dq.op_type != "DequantizeLinear":
                raise InternalError(f"tune --fp8: {name!r} reads {value!r} without float8")
            quantiser = producer.get(dq.input[0])
            if quantiser is not None and quantiser.op_type == "QuantizeLinear":
                plain = quantiser.input[0]  # the activation as the low-type model reads it
            else:
                original = graph.nodes[name].inputs[slot]
                plain = low_weights.get(original, "")
                if not plain:
                    plain = unique_name(f"{original}__low", taken)
                    taken.add(plain)
                    if original not in originals:
                        raise InternalError(f"tune --fp8: no stored weight {original!r}")
                    weight = numpy_helper.to_array(originals[original])
                    if kept_int8:
                        axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
                        main.initializer.extend(_int8_tensors(weight, axis, dtype, plain))
                        added.setdefault(id(node), []).append(helper.make_node(
                            "DequantizeLinear", [f"{plain}/int8", f"{plain}/scale"], [plain],
                            axis=axis,
                        ))  # fmt: skip
                        taken |= {f"{plain}/int8", f"{plain}/scale"}
                    else:
                        main.initializer.append(_low_tensor(weight, dtype, plain))
                    low_weights[original] = plain
            switched = unique_name(f"{value}__switched", taken)
            taken.add(switched)
            added.setdefault(id(node), []).append(
                helper.make_node("Where", [flag, value, plain], [switched])
            )
            node.input[slot] = switched
    nodes = []
    for node in main.node:
        nodes += added.get(id(node), [])
        nodes.append(node)
    del main.node[:]
    main.node.extend(nodes)
    return model


def _int8_tensors(weight: np.ndarray, axis: int, dtype: str, name: str) -> list[onnx.TensorProto]:
    """The float32 ``weight`` as a kept product's int8 copy and its scales per index of
    ``axis`` (the conversion's :func:`~graphamp.onnx.dialect.float8.quantise_channels_int8`),
    named ``name/int8`` and ``name/scale``."""
    from graphamp.onnx.dialect.float8 import quantise_channels_int8

    values, scales = quantise_channels_int8(
        np.asarray(weight, np.float32), axis % weight.ndim, numpy_type(dtype)
    )
    return [
        numpy_helper.from_array(values, f"{name}/int8"),
        numpy_helper.from_array(scales, f"{name}/scale"),
    ]


def _low_tensor(weight: np.ndarray, dtype: str, name: str) -> onnx.TensorProto:
    """The float32 ``weight`` rounded to ``dtype`` as the conversion stores it."""
    rounded: np.ndarray = to_target_limit(weight, dtype).astype(numpy_type(dtype))
    if dtype == "bfloat16":
        raw = rounded.view(np.uint16).tobytes()
        return helper.make_tensor(name, onnx.TensorProto.BFLOAT16, rounded.shape, raw, raw=True)
    return numpy_helper.from_array(rounded, name)
