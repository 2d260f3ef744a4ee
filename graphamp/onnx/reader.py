"""Reading an ONNX model into the neutral OpGraph.

Value types come from ONNX type inference (:mod:`graphamp.onnx.files`), with a local fallback
from the op schemas (an output bound to the same type variable as a typed input, Cast's ``to``,
fixed output types), so a tensor that inference missed still gets its casts. Per-slot rules
come from the op schemas at the model's opset (:mod:`graphamp.onnx.slots`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from graphamp.dialects.base import ReadGraph
from graphamp.dtypes import FLOAT_TYPES, UNKNOWN
from graphamp.errors import GraphampError
from graphamp.graph import NodeKind, OpGraph, OpNode, TensorInfo, unique_name
from graphamp.onnx import fusion, ir_tensors, kernels, slots, stream
from graphamp.onnx.types import dtype_name, ir_type


@dataclass
class OnnxHandles:
    """The onnx_ir objects the OpGraph's names stand for."""

    nodes: dict[str, ir.Node] = field(default_factory=dict)
    values: dict[str, ir.Value] = field(default_factory=dict)


def read(model: ir.Model, target: str, provider: str = "any") -> ReadGraph:
    """The OpGraph of ``model``'s main graph, for ``target`` on ``provider`` (kernels.TARGETS).

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
    # Nodes of one op with the same types get the same slots: the schema work is done once
    # per signature (a graph of 50,000 nodes may have a dozen).
    signatures: dict[tuple[object, ...], slots.Slots] = {}
    for node in graph:
        handles.nodes[node.name] = node
        for value in node.outputs:
            _add_value(op_graph, handles, value)
        op_node = _read_node(op_graph, model, node, opsets, target, signatures)
        if op_node.kind is NodeKind.OP and op_node.follow_inputs | op_node.follow_outputs:
            op_node.no_kernel = kernels.missing_kernel(
                provider, node.domain, node.op_type, slots.opset_of(opsets, node.domain), target
            )
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
    op_graph.fused_kernels = fusion.fused_kernels(opsets, target, provider, op_graph.tensors)
    return ReadGraph(op_graph, model, handles)


def _name_nodes(graph: ir.Graph) -> None:
    """Unnamed nodes get ``<op>__<first output>``; a name a node shares with an earlier one
    (ONNX allows it) gets a suffix, ``<name>_1``: the plan names each node once."""
    taken = {node.name for node in graph if node.name}
    seen: set[str] = set()
    for node in graph:
        if not node.name:
            first = next((v.name for v in node.outputs if v.name), "")
            node.name = unique_name(f"{node.op_type}__{first}" if first else node.op_type, taken)
        elif node.name in seen:
            node.name = unique_name(node.name, taken)
        seen.add(node.name)


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
        # a symbolic dim's name; None for a dim with neither value nor name
        shape = tuple(d if isinstance(d, int) else d.value for d in value.shape)
    tensor = TensorInfo(
        name=value.name, dtype=dtype_name(value.dtype), shape=shape, is_graph_input=graph_input
    )
    if value.const_value is not None:
        const = value.const_value
        tensor.load_value = ir_tensors.loader(const, budget)  # on disk until scanned
        tensor.on_disk = isinstance(const, ir.ExternalTensor)
        if tensor.dtype == UNKNOWN:
            tensor.dtype = dtype_name(const.dtype)
        if tensor.shape is None:
            tensor.shape = tuple(int(d) for d in const.shape)
    handles.values[value.name] = value
    op_graph.add_tensor(tensor)


_SUBGRAPH_ATTRIBUTES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def _read_node(
    op_graph: OpGraph,
    model: ir.Model,
    node: ir.Node,
    opsets: dict[str, int],
    target: str,
    signatures: dict[tuple[object, ...], slots.Slots],
) -> OpNode:
    op_node = OpNode(
        name=node.name,
        op=slots.op_name(node.op_type, node.domain),
        inputs=[v.name if v is not None else "" for v in node.inputs],
        outputs=[v.name for v in node.outputs],
        domain=node.domain,
        scope=node.name,
        schema_source=f"opset {opsets.get('', 0)}",
    )
    default_domain = node.domain in slots.DEFAULT_DOMAINS
    if default_domain and node.op_type == "Cast":
        op_node.kind = NodeKind.CAST
        op_node.cast_to = dtype_name(ir.DataType(node.attributes["to"].value))
        return op_node
    if default_domain and node.op_type == "Constant":
        op_node.kind = NodeKind.CONSTANT
        _attach_constant(op_graph, node)
        return op_node
    attributes = node.attributes.data  # the plain dict: its views are much quicker
    if node.op_type in slots.CONTROL_FLOW_OPS or (
        attributes and any(a.type in _SUBGRAPH_ATTRIBUTES for a in attributes.values())
    ):
        op_node.kind = NodeKind.CONTROL_FLOW
        op_node.implicit_inputs = _outer_scope_reads(node, model.graph)
        return op_node
    output_types = tuple(dtype_name(v.dtype) for v in node.outputs)

    def attribute(name: str) -> object:
        found = attributes.get(name)
        return found.value if found is not None else None

    return slots.computing_node(
        op_node, node.op_type, op_graph.tensors, output_types, opsets, target, signatures, attribute
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
        tensor.dtype = slots.output_type_fallback(op_node, node.op_type, slot, opsets) or UNKNOWN
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
