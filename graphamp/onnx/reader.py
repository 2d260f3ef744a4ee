"""Reading an ONNX model into the neutral OpGraph.

Value types come from ONNX type inference (:mod:`graphamp.onnx.files`), with a local fallback
from the op schemas (an output bound to the same type variable as a typed input, Cast's ``to``,
fixed output types), so a tensor that inference missed still gets its casts. Per-slot rules
come from the op schemas at the model's opset (:mod:`graphamp.onnx.slots`). The bodies of If,
Loop and Scan nodes are read into the same OpGraph where their owner is
(:mod:`graphamp.onnx.bodies`); a node with a body of another kind is kept whole.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphamp.core.dtypes import FLOAT_TYPES, UNKNOWN
from graphamp.core.graph import Body, NodeKind, OpGraph, OpNode, TensorInfo, unique_name
from graphamp.dialects.base import ReadGraph
from graphamp.errors import GraphampError
from graphamp.onnx import bodies, functions, fusion, ir_tensors, kernels, slots, stream
from graphamp.onnx.handles import FunctionId, OnnxHandles
from graphamp.onnx.outside import names_outside
from graphamp.onnx.scopes import module_path
from graphamp.onnx.types import dtype_name, ir_type


def read(model: ir.Model, target: str, provider: str = "any") -> ReadGraph:
    """The OpGraph of ``model``'s main graph and of the bodies of its If, Loop and Scan
    nodes, for ``target`` on ``provider`` (kernels.TARGETS).

    Unnamed nodes get a name derived from their op and first output, in the model itself, so
    that the plan and the output model agree on it.
    """
    reader = GraphReader(model, target, provider)
    graph, op_graph = model.graph, reader.op_graph
    op_graph.reserved = names_outside(model)  # what graphamp.core.names must not give out
    _name_nodes(graph)
    for function in model.functions.values():  # before any call site's copy is made
        _name_all(function)
    # a body's value is named by its path: never the name of a main-graph value
    reader.taken.update(v.name for v in (*graph.inputs, *graph.initializers.values()))
    reader.taken.update(v.name for node in graph for v in node.outputs)
    reader.taken_nodes.update(node.name for node in graph)
    initializer_names = set(graph.initializers)
    for value in graph.inputs:
        reader.add_value(value, "", graph_input=True)
    reader.read_graph(graph, "")
    for value in graph.outputs:
        op_graph.graph_outputs.append(value.name)
        op_graph.tensors[value.name].is_graph_output = True
    op_graph.graph_inputs = [v.name for v in graph.inputs if v.name not in initializer_names] + [
        v.name for v in graph.inputs if v.name in initializer_names
    ]
    if not any(t.is_float for t in op_graph.tensors.values()):
        raise GraphampError("the model computes on no floating-point tensor: nothing to convert")
    op_graph.fused_kernels = fusion.fused_kernels(reader.opsets, target, provider, op_graph.tensors)
    return ReadGraph(op_graph, model, reader.handles)


class GraphReader:
    """Reads graphs into one OpGraph: the main graph, and each body where its owner is."""

    def __init__(self, model: ir.Model, target: str, provider: str) -> None:
        self.model, self.target, self.provider = model, target, provider
        self.opsets = dict(model.opset_imports)
        self.op_graph = OpGraph(model.graph.name or "graph")
        self.handles = OnnxHandles()
        self.names: dict[ir.Value, str] = {}  # every value read: its name in the OpGraph
        self.taken: set[str] = set()  # the names given to values, and the main graph's
        self.taken_nodes: set[str] = set()  # the same for nodes
        self.budget = stream.CacheBudget()
        # Nodes of one op with the same types get the same slots: the schema work is done
        # once per signature (a graph of 50,000 nodes may have a dozen).
        self.signatures: dict[tuple[object, ...], slots.Slots] = {}
        self.calling: list[FunctionId] = []  # the functions being read, outermost first
        # The attributes the innermost function being read was called with (its references
        # resolve to them); None outside functions.
        self.bound: dict[str, ir.Attr] | None = None

    def attributes(self, node: ir.Node) -> dict[str, ir.Attr]:
        """``node``'s attributes, references to a function's attributes resolved."""
        return functions.resolve(node.attributes.data, self.bound)

    def name(self, value: ir.Value | None) -> str:
        """``value``'s name in the OpGraph ("" for an omitted one)."""
        return self.names[value] if value is not None else ""

    def add_value(self, value: ir.Value, body: str, *, graph_input: bool = False) -> str:
        """Add ``value``, which lives in ``body``, as a tensor: its name in the OpGraph (a
        body's value is named by its path)."""
        if not value.name:
            name = ""
        elif body:
            name = unique_name(f"{body}/{value.name}", self.taken)
        else:
            name = value.name
        self.names[value] = name
        _add_value(self.op_graph, self.handles, value, name, body, graph_input, self.budget)
        return name

    def read_body(self, graph: ir.Graph, body: Body, outer: ir.Graph) -> None:
        """Read the nodes of ``graph``, the body ``body`` of a node in ``outer`` (its
        parameters are read already, as what its boundary nodes produce)."""
        self.op_graph.add_body(body)
        self.handles.bodies[id(graph)] = (body, outer)
        _name_nodes(graph)
        self.read_graph(graph, body.path)

    def read_graph(self, graph: ir.Graph, body: str) -> None:
        """Read ``graph``'s initializers and nodes (its inputs are read already)."""
        for value in graph.initializers.values():
            if value not in self.names:
                self.add_value(value, body)
        for node in graph:
            self.read_node(node, body)

    def read_node(self, node: ir.Node, body: str) -> None:
        op_graph = self.op_graph
        path = unique_name(f"{body}/{node.name}", self.taken_nodes) if body else node.name
        self.handles.nodes[path] = node
        op_node = OpNode(
            name=path,
            op=slots.op_name(node.op_type, node.domain),
            inputs=[self.name(v) for v in node.inputs],
            outputs=[],
            domain=node.domain,
            scope=module_path(node.metadata_props) or node.name,
            schema_source=f"opset {self.opsets.get('', 0)}",
            body=body,
        )
        if functions.enter(self, node, op_node) or bodies.enter(self, node, op_node):
            return
        for value in node.outputs:
            self.add_value(value, body)
        op_node.outputs = [self.name(v) for v in node.outputs]
        self._fill(node, op_node)
        if op_node.kind is NodeKind.OP and op_node.follow_inputs | op_node.follow_outputs:
            op_node.no_kernel = kernels.missing_kernel(
                self.provider,
                node.domain,
                node.op_type,
                slots.opset_of(self.opsets, node.domain),
                self.target,
            )
        op_graph.add_node(op_node)
        _fill_output_types(op_graph, node, op_node, self.opsets)

    def _fill(self, node: ir.Node, op_node: OpNode) -> None:
        """Kind, slots and schema facts of a node that owns no body the reader entered."""
        default_domain = node.domain in slots.DEFAULT_DOMAINS
        attributes = self.attributes(node)
        if default_domain and node.op_type == "Cast":
            op_node.kind = NodeKind.CAST
            op_node.cast_to = dtype_name(ir.DataType(attributes["to"].value))
            return
        if default_domain and node.op_type == "Constant":
            op_node.kind = NodeKind.CONSTANT
            _attach_constant(self.op_graph.tensors[op_node.outputs[0]], attributes)
            return
        if node.op_type in slots.CONTROL_FLOW_OPS or (
            attributes and any(a.type in _SUBGRAPH_ATTRIBUTES for a in attributes.values())
        ):
            op_node.kind = NodeKind.CONTROL_FLOW  # kept whole, with its bodies as they are
            op_node.implicit_inputs = self._outer_scope_reads(node)
            return
        output_types = tuple(dtype_name(v.dtype) for v in node.outputs)

        def attribute(name: str) -> object:
            found = attributes.get(name)
            return found.value if found is not None else None

        slots.computing_node(
            op_node,
            node.op_type,
            self.op_graph.tensors,
            output_types,
            self.opsets,
            self.target,
            self.signatures,
            attribute,
        )

    def _outer_scope_reads(self, node: ir.Node) -> list[str]:
        """Names of the values an enclosing graph defines that ``node``'s subgraphs read, in
        first-use order (the values read so far: none of the subgraphs' own)."""
        names: dict[str, None] = {}
        for inner in subgraph_nodes(node):
            for value in inner.inputs:
                if value is not None and value in self.names:
                    names.setdefault(self.names[value])
        return list(names)


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
    name: str,
    body: str,
    graph_input: bool,
    budget: stream.CacheBudget,
) -> None:
    shape = None
    if value.shape is not None:
        # a symbolic dim's name; None for a dim with neither value nor name
        shape = tuple(d if isinstance(d, int) else d.value for d in value.shape)
    tensor = TensorInfo(
        name=name, dtype=dtype_name(value.dtype), shape=shape, body=body, is_graph_input=graph_input
    )
    if value.const_value is not None:
        const = value.const_value
        tensor.load_value = ir_tensors.loader(const, budget)  # on disk until scanned
        tensor.on_disk = isinstance(const, ir.ExternalTensor)
        if tensor.dtype == UNKNOWN:
            tensor.dtype = dtype_name(const.dtype)
        if tensor.shape is None:
            tensor.shape = tuple(int(d) for d in const.shape)
    handles.values[name] = value
    op_graph.add_tensor(tensor)


_SUBGRAPH_ATTRIBUTES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def _fill_output_types(
    op_graph: OpGraph, node: ir.Node, op_node: OpNode, opsets: dict[str, int]
) -> None:
    """Local type fallback for outputs that type inference left untyped."""
    tensors = op_graph.tensors
    for slot, name in enumerate(op_node.outputs):
        tensor = tensors[name]
        if tensor.dtype != UNKNOWN:
            continue
        tensor.dtype = slots.output_type_fallback(op_node, node.op_type, slot, opsets) or UNKNOWN
        value = node.outputs[slot]
        if tensor.dtype in FLOAT_TYPES and value.dtype is None:
            value.dtype = ir_type(tensor.dtype)


def _attach_constant(tensor: TensorInfo, attributes: dict[str, ir.Attr]) -> None:
    attr = attributes.get("value")
    if attr is not None and attr.type is ir.AttributeType.TENSOR:
        const = attr.value
        tensor.load_value = const.numpy
        tensor.dtype = dtype_name(const.dtype)
    elif "value_float" in attributes:
        tensor.load_value = lambda v=attributes["value_float"].value: np.array(v, np.float32)
        tensor.dtype = "float32"
    elif "value_floats" in attributes:
        tensor.load_value = lambda v=attributes["value_floats"].value: np.array(v, np.float32)
        tensor.dtype = "float32"


def _name_all(function: ir.Function) -> None:
    """Name the unnamed nodes of ``function`` and of every body in it (as the reader names a
    graph's), so that a call site's copy differs from the function only by its edits."""
    _name_nodes(function)  # type: ignore[arg-type]
    for node in ir.traversal.RecursiveGraphIterator(function):  # type: ignore[arg-type]
        for attr in node.attributes.values():
            if attr.type is ir.AttributeType.GRAPH:
                _name_nodes(attr.value)
            elif attr.type is ir.AttributeType.GRAPHS:
                for graph in attr.value:
                    _name_nodes(graph)


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
