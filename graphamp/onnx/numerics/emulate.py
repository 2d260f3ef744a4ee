"""A faithful evaluator for mixed-precision ONNX models on the CPU.

onnxruntime's CPU provider has almost no float16 kernels: it runs them in float32 between casts
it inserts, which hides both the rounding and the overflow of float16 (a hidden activation of
198,358 is fine in float32 and infinite in float16). :func:`emulated` rewrites a converted
model so that every op computes in float32 but every value that is float16/bfloat16 in the
converted model is rounded to that type right after it is produced (a round trip Cast
float32 -> low -> float32): storage rounding and overflow as the low type has them, at
onnxruntime's speed. The bodies of If, Loop and Scan nodes are rewritten the same way, and
model-local functions are inlined first (each call site's body then rounds as its own types
say). What it does not reproduce: the accumulation inside a kernel (a float16 MatMul on a GPU
accumulates in float32 or float16 depending on the kernel; here it is always float32), and the
kernel's own intermediate rounding.
"""

from __future__ import annotations

import onnx
import onnx.inliner
from onnx import helper, numpy_helper

from graphamp.core import dtypes
from graphamp.onnx.io.subgraphs import bodies, element_types, scopes, twinned_bodies
from graphamp.onnx.numerics.session import Weights, is_stub

LOW_CODES = {dtypes.BY_NAME[name].onnx: name for name in dtypes.LOW_TYPES}
F32 = onnx.TensorProto.FLOAT


def has_low_values(proto: onnx.ModelProto, types: dict[str, int]) -> bool:
    """Whether ``proto`` holds a float16/bfloat16 value: in ``types`` (its main graph's), or
    anywhere in a body or function (a Cast to a low type, a low weight or parameter)."""
    return any(code in LOW_CODES for code in types.values()) or any(
        mentions_low(scope) for scope in scopes(proto) if scope is not proto.graph
    )


def emulated(
    proto: onnx.ModelProto, types: dict[str, int], weights: Weights | None = None
) -> onnx.ModelProto:
    """A float32 copy of ``proto`` that rounds every low-precision value (module docstring).
    ``types`` maps value names to their element type in ``proto`` (graph I/O, initializers and
    what type inference finds). With ``weights``, the copy holds stubs of its large weights,
    whose values (a low one widened) are put in that store: nothing large is copied twice."""
    if weights is not None:
        proto = weights.stubbed(proto)
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    inferred = None
    if model.functions or any(bodies(node) for node in model.graph.node):
        if model.functions:
            model = onnx.inliner.inline_local_functions(model)
        # the types inside bodies (and of values inlining made) come from inference
        inferred = onnx.shape_inference.infer_shapes(model).graph
        types = {**element_types(inferred), **types}
    _emulate_graph(model.graph, types, inferred, weights, {})
    return model


def _emulate_graph(
    graph: onnx.GraphProto,
    types: dict[str, int],
    inferred: onnx.GraphProto | None,
    weights: Weights | None,
    outer: dict[str, str],
) -> None:
    """Rewrite ``graph`` (and its bodies) in place; ``inferred``: the same graph after type
    inference, for its bodies' types; ``outer``: the enclosing graphs' low inputs, each read
    under its rounded name (a body reads them as any other value of an enclosing scope)."""
    del graph.value_info[:]
    for init in graph.initializer:
        if init.data_type not in LOW_CODES:
            continue
        if weights is not None and is_stub(init):
            init.CopyFrom(weights.stub(init.name, weights.array(init).astype("float32")))
        else:  # exact: every low value is a float32 value
            init.CopyFrom(
                numpy_helper.from_array(numpy_helper.to_array(init).astype("float32"), init.name)
            )
    nodes: list[onnx.NodeProto] = []
    rounded_inputs = dict(outer)  # a low graph input, fed as float32, rounded first
    for value in graph.input:
        code = value.type.tensor_type.elem_type
        if code in LOW_CODES:
            value.type.tensor_type.elem_type = F32
            rounded_inputs[value.name] = f"{value.name}__emulated"
            nodes += _round_trip(value.name, rounded_inputs[value.name], code)
    inferred_nodes = list(inferred.node) if inferred is not None else []
    for index, node in enumerate(graph.node):
        _float32_attributes(node)
        if index < len(inferred_nodes):
            _emulate_bodies(node, inferred_nodes[index], types, weights, rounded_inputs)
        for slot, name in enumerate(node.input):
            node.input[slot] = rounded_inputs.get(name, name)
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx"):
            to = next(a for a in node.attribute if a.name == "to")
            if to.i in LOW_CODES:  # keep the rounding, then widen
                output = node.output[0]
                node.output[0] = f"{output}__emulated_low"
                nodes.append(node)
                nodes.append(helper.make_node("Cast", [node.output[0]], [output], to=F32))
                continue
        low_outputs = [(i, o) for i, o in enumerate(node.output) if o and types.get(o) in LOW_CODES]
        for slot, output in low_outputs:
            node.output[slot] = f"{output}__emulated_raw"
        nodes.append(node)
        for slot, output in low_outputs:
            nodes += _round_trip(node.output[slot], output, types[output])
    del graph.node[:]
    graph.node.extend(nodes)
    for value in graph.output:
        if value.type.tensor_type.elem_type in LOW_CODES:
            value.type.tensor_type.elem_type = F32


def _emulate_bodies(
    node: onnx.NodeProto,
    inferred_node: onnx.NodeProto,
    types: dict[str, int],
    weights: Weights | None,
    outer: dict[str, str],
) -> None:
    for _, body, inferred_body in twinned_bodies(node, inferred_node):
        body_types = {**types, **(element_types(inferred_body) if inferred_body else {})}
        _emulate_graph(body, body_types, inferred_body, weights, outer)


def mentions_low(graph: onnx.GraphProto | onnx.FunctionProto) -> bool:
    """Whether ``graph`` names a float16/bfloat16 type itself: a weight, a declared value, a
    Cast to one or a Constant of one (where a low value can start, types inferred or not)."""
    if isinstance(graph, onnx.GraphProto):
        if any(init.data_type in LOW_CODES for init in graph.initializer):
            return True
        infos = (*graph.input, *graph.output, *graph.value_info)
        if any(info.type.tensor_type.elem_type in LOW_CODES for info in infos):
            return True
    for node in graph.node:
        if node.op_type in ("Cast", "Constant") and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if (attr.name == "to" and attr.i in LOW_CODES) or (
                    attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in LOW_CODES
                ):
                    return True
    return False


def _round_trip(source: str, output: str, code: int) -> list[onnx.NodeProto]:
    low = f"{output}__emulated_low"
    return [
        helper.make_node("Cast", [source], [low], to=code),
        helper.make_node("Cast", [low], [output], to=F32),
    ]


def _float32_attributes(node: onnx.NodeProto) -> None:
    """Tensor attributes of a low type (Constant, ConstantOfShape) held as float32."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in LOW_CODES:
            values = numpy_helper.to_array(attr.t).astype("float32")
            attr.t.CopyFrom(numpy_helper.from_array(values, attr.t.name))
