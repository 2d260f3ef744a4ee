"""Reading an ONNX model into the neutral OpGraph.

Value types come from ONNX type inference (:mod:`graphamp.onnx.files`), with a local fallback
from the op schemas (an output bound to the same type variable as a typed input, Cast's ``to``,
fixed output types), so a tensor that inference missed still gets its casts. Per-slot rules
come from the op schemas at the model's opset (:mod:`graphamp.onnx.schemas`): the slots bound
to the type variable of the first float input are the node's computation-type slots; a second
float type variable follows it when its schema admits the target type, except where a runtime
needs float32 (Resize roi, Upsample scales).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from graphamp import dtypes
from graphamp.dialects.base import ReadGraph
from graphamp.dtypes import FLOAT_TYPES, UNKNOWN
from graphamp.errors import GraphampError
from graphamp.graph import NodeKind, OpGraph, OpNode, TensorInfo, unique_name
from graphamp.onnx import schemas, stream
from graphamp.onnx.types import dtype_name, ir_type, type_str_dtype

CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass
class OnnxHandles:
    """The onnx_ir objects the OpGraph's names stand for."""

    nodes: dict[str, ir.Node] = field(default_factory=dict)
    values: dict[str, ir.Value] = field(default_factory=dict)


def read(model: ir.Model, target: str) -> ReadGraph:
    """The OpGraph of ``model``'s main graph, for conversion to ``target``.

    Unnamed nodes get a name derived from their op and first output, in the model itself, so
    that the plan and the output model agree on it.
    """
    graph = model.graph
    opsets = dict(model.opset_imports)
    op_graph = OpGraph(graph.name or "graph")
    handles = OnnxHandles()
    _name_nodes(graph)

    initializer_names = set(graph.initializers)
    budget = stream.CacheBudget()
    for value in graph.inputs:
        _add_value(op_graph, handles, value, graph_input=True, budget=budget)
    for name, value in graph.initializers.items():
        if name not in handles.values:
            _add_value(op_graph, handles, value, budget=budget)
    for node in graph:
        handles.nodes[node.name] = node
        for value in node.outputs:
            _add_value(op_graph, handles, value)
        op_node = _read_node(op_graph, model, node, opsets, target)
        op_graph.add_node(op_node)
        _fill_output_types(op_graph, node, op_node, opsets)
    for value in graph.outputs:
        op_graph.graph_outputs.append(value.name)
        op_graph.tensors[value.name].is_graph_output = True
    op_graph.graph_inputs = [v.name for v in graph.inputs if v.name not in initializer_names] + [
        v.name for v in graph.inputs if v.name in initializer_names
    ]
    if not any(t.is_float for t in op_graph.tensors.values()):
        raise GraphampError("the model computes on no floating-point tensor: nothing to convert")
    return ReadGraph(op_graph, model, handles)


def _name_nodes(graph: ir.Graph) -> None:
    taken = {node.name for node in graph if node.name}
    for node in graph:
        if not node.name:
            first = next((v.name for v in node.outputs if v.name), "")
            node.name = unique_name(f"{node.op_type}__{first}" if first else node.op_type, taken)


def _add_value(
    op_graph: OpGraph,
    handles: OnnxHandles,
    value: ir.Value,
    *,
    graph_input: bool = False,
    budget: stream.CacheBudget | None = None,
) -> None:
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
        tensor.load_value = stream.loader(const, budget)  # on disk until scanned
        if tensor.dtype == UNKNOWN:
            tensor.dtype = dtype_name(const.dtype)
        if tensor.shape is None:
            tensor.shape = tuple(int(d) for d in const.shape)
    handles.values[value.name] = value
    op_graph.add_tensor(tensor)


def _opset(opsets: dict[str, int], domain: str) -> int:
    return opsets.get(domain, opsets.get("", 1))


def _read_node(
    op_graph: OpGraph, model: ir.Model, node: ir.Node, opsets: dict[str, int], target: str
) -> OpNode:
    inputs = [v.name if v is not None else "" for v in node.inputs]
    outputs = [v.name for v in node.outputs]
    op_node = OpNode(
        name=node.name,
        op=node.op_type,
        inputs=inputs,
        outputs=outputs,
        domain=node.domain,
        scope=node.name,
        schema_source=f"opset {opsets.get('', 0)}",
    )
    tensors = op_graph.tensors
    if node.domain in _DEFAULT_DOMAINS and node.op_type == "Cast":
        op_node.kind = NodeKind.CAST
        op_node.cast_to = dtype_name(ir.DataType(node.attributes["to"].value))
        return op_node
    if node.domain in _DEFAULT_DOMAINS and node.op_type == "Constant":
        op_node.kind = NodeKind.CONSTANT
        _attach_constant(op_graph, node)
        return op_node
    if node.op_type in CONTROL_FLOW_OPS or any(
        a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for a in node.attributes.values()
    ):
        op_node.kind = NodeKind.CONTROL_FLOW
        op_node.implicit_inputs = _outer_scope_reads(node, model.graph)
        return op_node
    found = schemas.schema(node.op_type, _opset(opsets, node.domain), node.domain)
    if found is None:
        if node.domain in _DEFAULT_DOMAINS:
            raise GraphampError(
                f"node {node.name!r}: unknown op {node.op_type!r} at opset {opsets.get('', 0)}"
            )
        op_node.kind = NodeKind.OPAQUE
        return op_node

    _check_input_types(node, found, inputs, tensors)
    op_node.any_type_inputs = schemas.any_type_inputs(found, inputs, len(outputs))
    # The computation type: the type variable of the first float (or unknown) input.
    primary: str | None = None
    for slot, name in enumerate(inputs):
        param = found.input_param(slot)
        if not name or param not in found.allowed or slot in op_node.any_type_inputs:
            continue
        dtype = tensors[name].dtype
        if dtype in FLOAT_TYPES or (dtype == UNKNOWN and "float32" in found.allowed[param]):
            primary, op_node.compute_type = param, dtype
            if dtype != UNKNOWN:
                break
    if primary is None:
        for slot, value in enumerate(node.outputs):
            param = found.output_param(slot)
            if param in found.allowed and dtype_name(value.dtype) in FLOAT_TYPES:
                primary, op_node.compute_type = param, dtype_name(value.dtype)
                break
    if primary is None:
        return op_node  # computes on no float type

    op_node.allowed_types = schemas.float_types(found, primary)
    needs = (
        schemas.FLOAT32_WHEN_OUTPUT.get(node.op_type) if node.domain in _DEFAULT_DOMAINS else None
    )
    if needs is not None and len(outputs) > needs[0] and outputs[needs[0]]:
        op_node.allowed_types -= dtypes.LOW_TYPES
        op_node.schema_source += f" with {needs[1]}"
    keep_float32 = schemas.FLOAT32_INPUTS.get(node.op_type, frozenset())
    follow_in = set()
    for slot, name in enumerate(inputs):
        param = found.input_param(slot)
        if not name or param not in found.allowed or slot in keep_float32:
            continue
        if param == primary or (
            target in found.allowed[param] and tensors[name].dtype == op_node.compute_type
        ):
            follow_in.add(slot)
    op_node.follow_inputs = frozenset(follow_in)
    # A slot that carries the computation type follows the node even where its type variable
    # is its own (Attention's V: T2): kernels and function bodies bind it with the others.
    op_node.any_type_inputs -= op_node.follow_inputs
    # An output follows when its type variable is one a following input binds (Attention's
    # present_value is T2, as V is).
    following = {primary} | {found.input_param(slot) for slot in follow_in}
    op_node.follow_outputs = frozenset(
        slot
        for slot in range(len(outputs))
        if outputs[slot] and found.output_param(slot) in following
    )
    if op_node.op in ("MatMul", "Gemm", "Conv", "ConvTranspose"):
        op_node.flops = _matrix_flops(op_node, tensors, node)
    return op_node


def _check_input_types(
    node: ir.Node, found: schemas.Schema, inputs: list[str], tensors: dict[str, TensorInfo]
) -> None:
    """Refuse an input whose type the op's schema does not admit (a string into MatMul): a
    Cast to the low type would be inserted in front of it otherwise."""
    for slot, name in enumerate(inputs):
        param = found.input_param(slot)
        dtype = tensors[name].dtype if name else UNKNOWN
        # only tensor type variables: a sequence's element type says nothing here
        admitted_types = found.allowed.get(param, frozenset()) & set(dtypes.BY_NAME)  # type: ignore[arg-type]
        if admitted_types and dtype in dtypes.BY_NAME and dtype not in admitted_types:
            admitted = ", ".join(sorted(admitted_types))
            raise GraphampError(
                f"node {node.name!r} ({node.op_type}): input {slot} {name!r} is {dtype}, which "
                f"{node.op_type} does not take (it takes {admitted})"
            )


def _fill_output_types(
    op_graph: OpGraph, node: ir.Node, op_node: OpNode, opsets: dict[str, int]
) -> None:
    """Local type fallback for outputs that type inference left untyped."""
    tensors = op_graph.tensors
    for slot, value in enumerate(node.outputs):
        tensor = tensors[value.name]
        if tensor.dtype != UNKNOWN:
            continue
        if op_node.kind is NodeKind.CAST:
            tensor.dtype = str(op_node.cast_to)
        elif slot in op_node.follow_outputs and op_node.compute_type:
            tensor.dtype = op_node.compute_type
        elif op_node.kind is NodeKind.OP:
            found = schemas.schema(node.op_type, _opset(opsets, node.domain), node.domain)
            param = found.output_param(slot) if found else None
            if param is not None and found is not None and param not in found.allowed:
                tensor.dtype = type_str_dtype(param)
        if tensor.dtype in FLOAT_TYPES and value.dtype is None:
            value.dtype = ir_type(tensor.dtype)


def _attach_constant(op_graph: OpGraph, node: ir.Node) -> None:
    tensor = op_graph.tensors[node.outputs[0].name]
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
    for inner in subgraph_nodes(node):
        for value in inner.inputs:
            if value is not None and value.graph is main:
                names.setdefault(value.name)
    return list(names)


def subgraph_nodes(node: ir.Node) -> list[ir.Node]:
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
