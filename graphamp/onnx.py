"""The ONNX dialect: read a model into an OpGraph, apply a Plan back, load and save files.

Reading uses ONNX type inference for value types, with a local fallback from the op schemas
(output bound to the same type variable as a typed input, Cast's ``to``, fixed output types),
so a tensor that inference missed still gets its casts. Per-slot rules come from the op
schemas at the model's opset: the slots bound to the type variable of the first float input
are the node's computation-type slots; a second float type variable follows it when its schema
admits the target type, except where a runtime needs float32 (Resize roi, Upsample scales).

Editing uses ``onnx_ir``. Inserted Casts go right after their producer (or first, for graph
inputs and initializers), so the node order stays topological without a re-sort.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from graphamp.errors import GraphampError
from graphamp.graph import FLOAT_TYPES, UNKNOWN, NodeKind, OpGraph, OpNode, TensorInfo
from graphamp.passes import run_passes
from graphamp.passes.numerics import convert_values
from graphamp.plan import Plan
from graphamp.policy import Policy

log = logging.getLogger(__name__)

# Inputs a runtime needs in float32 even when the op runs in low precision (onnxruntime's
# float16 tool ALWAYS_FLOAT_INPUTS; onnxruntime #8327, onnxconverter-common #306).
FLOAT32_INPUTS: dict[str, frozenset[int]] = {
    "Resize": frozenset({1, 2}),
    "Upsample": frozenset({1}),
}
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
EXTERNAL_DATA_THRESHOLD = 1_900_000_000  # bytes of weights above which we write external data
EXTERNAL_DATA_KEY = "graphamp.external_data"

_DTYPE_NAMES = {
    ir.DataType.FLOAT: "float32",
    ir.DataType.FLOAT16: "float16",
    ir.DataType.BFLOAT16: "bfloat16",
    ir.DataType.DOUBLE: "float64",
}
_IR_TYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}
_TYPE_STRS = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(bfloat16)": "bfloat16",
    "tensor(double)": "float64",
}


def dtype_name(dtype: ir.DataType | None) -> str:
    if dtype is None:
        return UNKNOWN
    return _DTYPE_NAMES.get(dtype) or dtype.name.lower()


def _type_str_dtype(type_str: str) -> str:
    if type_str in _TYPE_STRS:
        return _TYPE_STRS[type_str]
    if type_str.startswith("tensor(") and type_str.endswith(")"):
        return type_str[7:-1]
    return UNKNOWN


# -- loading ----------------------------------------------------------------------------------


def load(path: str | os.PathLike[str]) -> ir.Model:
    """Read an ONNX file (with its external data) and run type inference on it."""
    path = Path(path)
    if not path.is_file():
        raise GraphampError(f"{path}: no such file")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises several unrelated types for bad bytes
        raise GraphampError(f"{path}: not an ONNX model ({type(exc).__name__}: {exc})") from None
    return from_proto(proto, where=str(path), base_dir=path.parent)


def from_proto(
    proto: onnx.ModelProto, *, where: str = "model", base_dir: Path | None = None
) -> ir.Model:
    """An onnx_ir model from ``proto`` (not modified), with inferred value types."""
    if not isinstance(proto, onnx.ModelProto) or not proto.HasField("graph"):
        raise GraphampError(f"{where}: not an ONNX model (no graph)")
    if not proto.graph.node:
        raise GraphampError(f"{where}: the graph has no nodes")
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as exc:
        raise GraphampError(f"{where}: malformed ONNX model ({exc})") from None
    _apply_inferred_types(model, proto, where)
    if base_dir is not None:
        ir.external_data.set_base_dir(model.graph, base_dir)
    # Remembered for save(): a model whose weights lived outside keeps them outside.
    model.meta[EXTERNAL_DATA_KEY] = _has_external(model)
    return model


def _apply_inferred_types(model: ir.Model, proto: onnx.ModelProto, where: str) -> None:
    """Type every value that ONNX type inference can type.

    Inference runs on a copy whose large initializers are stubs (dims and type, data marked
    external): it needs no weight values, and passing gigabytes of weights through the C++
    binding twice would cost more than the whole conversion.
    """
    light = _without_large_initializers(proto)
    try:
        inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
    except Exception as exc:  # inference gives up on some contrib ops: fall back to local rules
        log.warning("%s: ONNX type inference failed (%s); using local type rules", where, exc)
        return
    values = {v.name: v for v in model.graph.inputs}
    for node in model.graph:
        for value in node.outputs:
            values[value.name] = value
    for info in [*inferred.graph.value_info, *inferred.graph.output]:
        value = values.get(info.name)
        if value is None or not info.type.HasField("tensor_type"):
            continue
        if value.type is None:
            value.type = ir.serde.deserialize_type_proto_for_type(info.type)
        if value.shape is None and info.type.tensor_type.HasField("shape"):
            value.shape = ir.serde.deserialize_type_proto_for_shape(info.type)


def inferred_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> ONNX element type for every typed value of ``proto``'s main graph
    (graph I/O, initializers, and what type inference finds), without copying weights."""
    inferred = onnx.shape_inference.infer_shapes(_without_large_initializers(proto))
    types = {init.name: init.data_type for init in proto.graph.initializer}
    for info in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        if info.type.HasField("tensor_type"):
            types[info.name] = info.type.tensor_type.elem_type
    return types


def _without_large_initializers(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` whose initializers of over 256 elements are data-less external
    stubs (small ones stay: shape computations read their values). Nothing big is copied."""
    if not any(_elements(init) > 256 for init in proto.graph.initializer):
        return proto
    light = onnx.ModelProto()
    for descriptor, value in proto.ListFields():
        if descriptor.name != "graph":
            _copy_field(light, descriptor, value)
    for descriptor, value in proto.graph.ListFields():
        if descriptor.name != "initializer":
            _copy_field(light.graph, descriptor, value)
    for init in proto.graph.initializer:
        if _elements(init) <= 256:
            light.graph.initializer.append(init)
            continue
        stub = light.graph.initializer.add(name=init.name, data_type=init.data_type)
        stub.dims.extend(init.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        stub.external_data.add(key="location", value="graphamp-type-inference-stub")
    return light


def _elements(tensor: onnx.TensorProto) -> int:
    return int(np.prod(tensor.dims)) if tensor.dims else 1


def _copy_field(message, descriptor, value) -> None:  # type: ignore[no-untyped-def]
    if descriptor.is_repeated:
        getattr(message, descriptor.name).extend(value)
    elif descriptor.type == descriptor.TYPE_MESSAGE:
        getattr(message, descriptor.name).CopyFrom(value)
    else:
        setattr(message, descriptor.name, value)


# -- reading into an OpGraph ------------------------------------------------------------------


@dataclass
class OnnxGraph:
    """An OpGraph with the onnx_ir objects its names stand for."""

    graph: OpGraph
    model: ir.Model
    nodes: dict[str, ir.Node] = field(default_factory=dict)
    values: dict[str, ir.Value] = field(default_factory=dict)


@dataclass(frozen=True)
class _Schema:
    inputs: tuple[tuple[str, bool], ...]  # (type_str, variadic)
    outputs: tuple[tuple[str, bool], ...]
    allowed: dict[str, frozenset[str]]  # type parameter -> dtype names


@cache
def _schema(op: str, opset: int, domain: str) -> _Schema | None:
    try:
        schema = onnx.defs.get_schema(op, opset, domain)
    except onnx.defs.SchemaError:
        return None
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    return _Schema(
        inputs=tuple((p.type_str, p.option == variadic) for p in schema.inputs),
        outputs=tuple((p.type_str, p.option == variadic) for p in schema.outputs),
        allowed={
            c.type_param_str: frozenset(_type_str_dtype(t) for t in c.allowed_type_strs)
            for c in schema.type_constraints
        },
    )


def _formal(params: tuple[tuple[str, bool], ...], index: int) -> str | None:
    if index < len(params):
        return params[index][0]
    if params and params[-1][1]:  # the last formal parameter is variadic
        return params[-1][0]
    return None


def read(model: ir.Model, target: str) -> OnnxGraph:
    """The OpGraph of ``model``'s main graph, for conversion to ``target``.

    Unnamed nodes get a name derived from their op and first output, in the model itself, so
    that the plan and the output model agree on it.
    """
    graph = model.graph
    opsets = dict(model.opset_imports)
    op_graph = OpGraph(graph.name or "graph")
    op_graph.opset = opsets.get("", 0)
    result = OnnxGraph(op_graph, model)
    _name_nodes(graph)

    initializer_names = set(graph.initializers)
    for value in graph.inputs:
        _add_value(result, value, graph_input=True)
    for name, value in graph.initializers.items():
        if name not in result.values:
            _add_value(result, value)
    for node in graph:
        result.nodes[node.name] = node
        for value in node.outputs:
            _add_value(result, value)
        op_graph.add_node(_read_node(result, node, opsets, target))
        _fill_output_types(result, node, op_graph.nodes[node.name], opsets)
    for value in graph.outputs:
        op_graph.graph_outputs.append(value.name)
        op_graph.tensors[value.name].is_graph_output = True
    op_graph.graph_inputs = [v.name for v in graph.inputs if v.name not in initializer_names] + [
        v.name for v in graph.inputs if v.name in initializer_names
    ]
    if not any(t.is_float for t in op_graph.tensors.values()):
        raise GraphampError("the model computes on no floating-point tensor: nothing to convert")
    return result


def _name_nodes(graph: ir.Graph) -> None:
    taken = {node.name for node in graph if node.name}
    for node in graph:
        if node.name:
            continue
        first = next((v.name for v in node.outputs if v.name), "")
        base = f"{node.op_type}__{first}" if first else node.op_type
        name, index = base, 1
        while name in taken:
            name, index = f"{base}_{index}", index + 1
        node.name = name
        taken.add(name)


def _add_value(result: OnnxGraph, value: ir.Value, *, graph_input: bool = False) -> None:
    shape = None
    if value.shape is not None:
        shape = tuple(
            d if isinstance(d, int) else (str(d) if d is not None else None) for d in value.shape
        )
    tensor = TensorInfo(
        name=value.name, dtype=dtype_name(value.dtype), shape=shape, is_graph_input=graph_input
    )
    if value.const_value is not None:
        const = value.const_value
        tensor.load_value = const.numpy
        if tensor.dtype == UNKNOWN:
            tensor.dtype = dtype_name(const.dtype)
        if tensor.shape is None:
            tensor.shape = tuple(int(d) for d in const.shape)
    result.values[value.name] = value
    result.graph.add_tensor(tensor)


def _read_node(result: OnnxGraph, node: ir.Node, opsets: dict[str, int], target: str) -> OpNode:
    inputs = [v.name if v is not None else "" for v in node.inputs]
    outputs = [v.name for v in node.outputs]
    op_node = OpNode(
        name=node.name,
        op=node.op_type,
        inputs=inputs,
        outputs=outputs,
        domain=node.domain,
        scope=node.name,
    )
    tensors = result.graph.tensors
    if node.domain in ("", "ai.onnx") and node.op_type == "Cast":
        op_node.kind = NodeKind.CAST
        op_node.attrs["to"] = dtype_name(ir.DataType(node.attributes["to"].value))
        return op_node
    if node.domain in ("", "ai.onnx") and node.op_type == "Constant":
        op_node.kind = NodeKind.CONSTANT
        _attach_constant(result, node)
        return op_node
    if node.op_type in CONTROL_FLOW_OPS or any(
        a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for a in node.attributes.values()
    ):
        op_node.kind = NodeKind.CONTROL_FLOW
        op_node.implicit_inputs = _outer_scope_reads(node, result.model.graph)
        return op_node
    schema = _schema(node.op_type, opsets.get(node.domain, opsets.get("", 1)), node.domain)
    if schema is None:
        if node.domain in ("", "ai.onnx"):
            raise GraphampError(
                f"node {node.name!r}: unknown op {node.op_type!r} at opset {opsets.get('', 0)}"
            )
        op_node.kind = NodeKind.OPAQUE
        return op_node

    op_node.any_type_inputs = _any_type_inputs(schema, inputs, len(outputs))
    # The computation type: the type variable of the first float (or unknown) input.
    primary: str | None = None
    for slot, name in enumerate(inputs):
        param = _formal(schema.inputs, slot)
        if not name or param not in schema.allowed or slot in op_node.any_type_inputs:
            continue
        dtype = tensors[name].dtype
        if dtype in FLOAT_TYPES or (dtype == UNKNOWN and "float32" in schema.allowed[param]):
            primary, op_node.compute_type = param, dtype
            if dtype != UNKNOWN:
                break
    if primary is None:
        for slot, value in enumerate(node.outputs):
            param = _formal(schema.outputs, slot)
            if param in schema.allowed and dtype_name(value.dtype) in FLOAT_TYPES:
                primary, op_node.compute_type = param, dtype_name(value.dtype)
                break
    if primary is None:
        return op_node  # computes on no float type

    op_node.allowed_types = frozenset(schema.allowed[primary] & FLOAT_TYPES)
    keep_float32 = FLOAT32_INPUTS.get(node.op_type, frozenset())
    follow_in = set()
    for slot, name in enumerate(inputs):
        param = _formal(schema.inputs, slot)
        if not name or param not in schema.allowed or slot in keep_float32:
            continue
        if param == primary or (
            target in schema.allowed[param] and tensors[name].dtype == op_node.compute_type
        ):
            follow_in.add(slot)
    op_node.follow_inputs = frozenset(follow_in)
    op_node.follow_outputs = frozenset(
        slot
        for slot in range(len(outputs))
        if outputs[slot] and _formal(schema.outputs, slot) == primary
    )
    if op_node.op in ("MatMul", "Gemm", "Conv", "ConvTranspose"):
        flops = _matrix_flops(op_node, tensors, node)
        if flops:
            op_node.attrs["flops"] = flops
    return op_node


def _any_type_inputs(schema: _Schema, inputs: list[str], outputs: int) -> frozenset[int]:
    """Input slots whose type variable appears at no other input or output and admits all the
    float types: such a slot reads any float type as it is."""
    uses: dict[str, int] = {}
    for slot in range(len(inputs)):
        param = _formal(schema.inputs, slot)
        if param in schema.allowed:
            uses[param] = uses.get(param, 0) + 1
    for slot in range(outputs):
        param = _formal(schema.outputs, slot)
        if param in schema.allowed:
            uses[param] = uses.get(param, 0) + 1
    return frozenset(
        slot
        for slot, name in enumerate(inputs)
        if name
        and (param := _formal(schema.inputs, slot)) in schema.allowed
        and uses[param] == 1
        and {"float32", "float16", "bfloat16"} <= schema.allowed[param]
    )


def _fill_output_types(
    result: OnnxGraph, node: ir.Node, op_node: OpNode, opsets: dict[str, int]
) -> None:
    """Local type fallback for outputs that type inference left untyped."""
    tensors = result.graph.tensors
    for slot, value in enumerate(node.outputs):
        tensor = tensors[value.name]
        if tensor.dtype != UNKNOWN:
            continue
        if op_node.kind is NodeKind.CAST:
            tensor.dtype = str(op_node.attrs["to"])
        elif slot in op_node.follow_outputs and op_node.compute_type:
            tensor.dtype = op_node.compute_type
        elif op_node.kind is NodeKind.OP:
            schema = _schema(node.op_type, opsets.get(node.domain, opsets.get("", 1)), node.domain)
            param = _formal(schema.outputs, slot) if schema else None
            if param is not None and param not in (schema.allowed if schema else {}):
                tensor.dtype = _type_str_dtype(param)
        if tensor.dtype != UNKNOWN and tensor.dtype in _IR_TYPES and value.dtype is None:
            value.dtype = _IR_TYPES[tensor.dtype]


def _attach_constant(result: OnnxGraph, node: ir.Node) -> None:
    value = node.outputs[0]
    tensor = result.graph.tensors[value.name]
    attr = node.attributes.get("value")
    if attr is not None and attr.type is ir.AttributeType.TENSOR:
        const = attr.value
        tensor.load_value = const.numpy
        tensor.dtype = dtype_name(const.dtype)
    elif "value_float" in node.attributes:
        tensor.load_value = lambda v=node.attributes["value_float"].value: np.array(v, np.float32)
        tensor.dtype = "float32"
    elif "value_floats" in node.attributes:
        tensor.load_value = lambda v=node.attributes["value_floats"].value: np.array(v, np.float32)
        tensor.dtype = "float32"


def _outer_scope_reads(node: ir.Node, main: ir.Graph) -> list[str]:
    """Names of main-graph values read inside ``node``'s subgraphs, in first-use order."""
    names: dict[str, None] = {}
    for inner in _subgraph_nodes(node):
        for value in inner.inputs:
            if value is not None and value.graph is main:
                names.setdefault(value.name)
    return list(names)


def _matrix_flops(op_node: OpNode, tensors: dict[str, TensorInfo], node: ir.Node) -> int | None:
    out = tensors[op_node.outputs[0]].shape
    if not out or not all(isinstance(d, int) for d in out):
        return None
    out_elems = int(np.prod(out))
    a = tensors[op_node.inputs[0]].shape
    b = tensors[op_node.inputs[1]].shape if len(op_node.inputs) > 1 else None
    if op_node.op == "MatMul" and a and isinstance(a[-1], int):
        return 2 * out_elems * int(a[-1])
    if op_node.op == "Gemm" and a and len(a) == 2:
        trans_a = node.attributes.get("transA")
        k = a[0] if trans_a is not None and trans_a.value else a[1]
        return 2 * out_elems * int(k) if isinstance(k, int) else None
    if op_node.op in ("Conv", "ConvTranspose") and b and all(isinstance(d, int) for d in b):
        return 2 * out_elems * int(np.prod(b[1:]))  # type: ignore[arg-type]
    return None


# -- applying a plan --------------------------------------------------------------------------


def apply(onnx_graph: OnnxGraph, plan: Plan) -> ir.Model:
    """Apply ``plan.edits`` to ``onnx_graph.model`` (modified in place and returned)."""
    graph = onnx_graph.model.graph
    values, nodes, op_graph = onnx_graph.values, onnx_graph.nodes, onnx_graph.graph
    edits = plan.edits

    for record in edits.weights:
        converted = convert_values(op_graph.tensors[record.name].load_value(), record.dst)  # type: ignore[misc]
        if converted.overflowed:
            # classify keeps the readers of such weights float32: reaching here is a bug, and
            # clamping silently is the one thing graphamp must never do.
            raise AssertionError(f"weight {record.name!r} would overflow {record.dst}")
        tensor = ir.Tensor(converted.values, name=record.stored_as)
        source = values[record.name]
        if not record.in_place:
            copy = ir.Value(
                name=record.stored_as,
                shape=source.shape,
                type=ir.TensorType(_IR_TYPES[record.dst]),
                const_value=tensor,
            )
            graph.register_initializer(copy)
            values[record.stored_as] = copy
        elif source.producer() is not None:  # a Constant node
            source.producer().attributes["value"] = ir.AttrTensor("value", tensor)  # type: ignore[union-attr]
            source.dtype = _IR_TYPES[record.dst]
        else:
            source.const_value = tensor
            source.dtype = _IR_TYPES[record.dst]

    for name, dtype in edits.retype.items():
        values[name].dtype = _IR_TYPES[dtype]

    for record in edits.casts:
        _insert_cast(graph, values, record.tensor, record.dst, record.output)

    for (node_name, slot), tensor in edits.rewire.items():
        node = nodes[node_name]
        if slot >= 0:
            node.replace_input_with(slot, values[tensor])
        else:
            old = values[op_graph.nodes[node_name].implicit_inputs[-1 - slot]]
            _rewire_inside(node, old, values[tensor])

    for node_name, dtype in edits.retarget_casts.items():
        nodes[node_name].attributes["to"] = ir.AttrInt64("to", _IR_TYPES[dtype])

    if edits.remove_nodes:
        graph.remove([nodes[name] for name in edits.remove_nodes], safe=True)

    for record in edits.output_casts:
        low_value = values[record.output]
        low_value.name = record.tensor
        values[record.tensor] = low_value
        cast_out = _insert_cast(graph, values, record.tensor, record.dst, record.output)
        for index, output in enumerate(graph.outputs):
            if output is low_value:
                graph.outputs[index] = cast_out
    return onnx_graph.model


def _insert_cast(
    graph: ir.Graph, values: dict[str, ir.Value], tensor: str, dtype: str, output: str
) -> ir.Value:
    source = values[tensor]
    out = ir.Value(name=output, shape=source.shape, type=ir.TensorType(_IR_TYPES[dtype]))
    cast = ir.Node(
        "", "Cast", [source], [ir.AttrInt64("to", _IR_TYPES[dtype])], outputs=[out], name=output
    )
    producer = source.producer()
    if producer is not None and producer.graph is graph:
        graph.insert_after(producer, cast)
    else:
        graph.insert_before(next(iter(graph)), cast)
    values[output] = out
    return out


def _rewire_inside(node: ir.Node, old: ir.Value, new: ir.Value) -> None:
    """Make the subgraphs of ``node`` read ``new`` wherever they read ``old``."""
    inner = {id(n) for n in _subgraph_nodes(node)}
    for use in list(old.uses()):
        if id(use.node) in inner:
            use.node.replace_input_with(use.idx, new)


def _subgraph_nodes(node: ir.Node) -> list[ir.Node]:
    """Every node inside ``node``'s subgraphs, nested ones included."""
    found: list[ir.Node] = []
    for attr in node.attributes.values():
        graphs = (
            [attr.value]
            if attr.type is ir.AttributeType.GRAPH
            else (list(attr.value) if attr.type is ir.AttributeType.GRAPHS else [])
        )
        for subgraph in graphs:
            found.extend(ir.traversal.RecursiveGraphIterator(subgraph))
    return found


# -- the whole conversion ---------------------------------------------------------------------


@dataclass
class Conversion:
    """What :func:`convert` returns: the converted model, its plan, and timings."""

    model: ir.Model
    plan: Plan
    seconds: dict[str, float]
    graph: OpGraph  # the input's dataflow view, for reports

    def to_proto(self) -> onnx.ModelProto:
        return ir.to_proto(self.model)


def analyse(
    model: str | os.PathLike[str] | onnx.ModelProto | ir.Model,
    policy: Policy | None = None,
    **overrides: object,
) -> tuple[OnnxGraph, Plan, dict[str, float]]:
    """Read ``model`` and run the passes: the graph, its plan and the time of each step.
    Nothing is converted; :func:`convert` applies the plan."""
    timer = _Timer()
    if policy is None:
        policy = Policy.create(where="convert()", **overrides)  # type: ignore[arg-type]
    elif overrides:
        raise GraphampError("pass either a policy or keyword overrides, not both")
    where = str(model) if isinstance(model, str | os.PathLike) else "model"
    if isinstance(model, str | os.PathLike):
        ir_model = load(model)
    elif isinstance(model, onnx.ModelProto):
        ir_model = from_proto(model)
    elif isinstance(model, ir.Model):
        ir_model = model
    else:
        raise GraphampError(f"expected a path or an ONNX model, got {type(model).__name__}")
    timer.lap("load")
    onnx_graph = read(ir_model, policy.dtype)
    timer.lap("read")
    plan = run_passes(onnx_graph.graph, policy, model=Path(where).name)
    timer.lap("passes")
    return onnx_graph, plan, timer.seconds


def convert(
    model: str | os.PathLike[str] | onnx.ModelProto | ir.Model,
    policy: Policy | None = None,
    **overrides: object,
) -> Conversion:
    """Convert a float32 ONNX model to mixed precision.

    ``model`` is a path, a ``ModelProto`` (never modified) or an ``onnx_ir`` model (which is
    converted in place). ``policy`` defaults to the float16 defaults; keyword ``overrides``
    (``dtype``, ``allow``, ``deny_names``, ``keep_io_types``, ...) go to :meth:`Policy.create`.
    """
    onnx_graph, plan, seconds = analyse(model, policy, **overrides)
    start = time.perf_counter()
    apply(onnx_graph, plan)
    seconds["apply"] = time.perf_counter() - start
    log.info("converted in %.2f s", sum(seconds.values()))
    return Conversion(onnx_graph.model, plan, seconds, onnx_graph.graph)


def save(model: ir.Model, path: str | os.PathLike[str]) -> None:
    """Write ``model`` atomically; weights go to ``<name>.data`` beside it when over 2 GB
    or when the input kept them there."""
    path = Path(path)
    external = (
        _weight_bytes(model) > EXTERNAL_DATA_THRESHOLD
        or _has_external(model)
        or bool(model.meta.get(EXTERNAL_DATA_KEY))
    )
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp:
        tmp_path = Path(tmp) / path.name
        data_name = f"{path.name}.data"
        if external:
            ir.save(model, tmp_path, external_data=data_name, size_threshold_bytes=1024)
        else:
            ir.save(model, tmp_path)
        if external:
            os.replace(Path(tmp) / data_name, path.parent / data_name)
        os.replace(tmp_path, path)


def _weight_bytes(model: ir.Model) -> int:
    return sum(
        v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None
    )


def _has_external(model: ir.Model) -> bool:
    return any(
        isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()
    )


class _Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = now - self._last
        self._last = now
