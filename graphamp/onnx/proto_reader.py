"""Reading a ``ModelProto`` into the OpGraph without building an onnx_ir model.

Deserialising a graph of 50,000 nodes into onnx_ir objects and serialising the result back
took most of a conversion's time; for the models that need none of onnx_ir's machinery (no
subgraphs, no model-local functions, no external data) the ONNX dialect reads the proto
directly here and :mod:`graphamp.onnx.proto_writer` patches a copy of it. Everything else
about the graph (slots from schemas, the type fallback, unnamed nodes' names) is what
:mod:`graphamp.onnx.reader` gives; ``tests/onnx/test_proto_path.py`` holds the two to the same
OpGraph and the same output model over ONNX's node test cases.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from graphamp.core import dtypes
from graphamp.core.dtypes import UNKNOWN
from graphamp.core.graph import NodeKind, OpGraph, OpNode, TensorInfo, unique_name
from graphamp.dialects.base import ReadGraph
from graphamp.errors import GraphampError
from graphamp.onnx import fusion, kernels, slots, stream
from graphamp.onnx.infile import InFileTensor
from graphamp.onnx.scopes import module_path_of_entries
from graphamp.onnx.validate_nodes import DEFAULT_DOMAINS, NodeFields, node_fields

_SUBGRAPHS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_CAST_OR_CONSTANT = frozenset({"Cast", "Constant"})


@dataclass
class ProtoModel:
    """A model read straight from its proto: the caller's proto (never changed), the
    ValueInfoProto of each value it declares (inputs, value_info, outputs) and the serialised
    TypeProto of every typed value (the model's own where it gives type and shape, else type
    inference's, for both)."""

    proto: onnx.ModelProto
    value_info: dict[str, onnx.ValueInfoProto]
    types: dict[str, bytes]
    # The graph's nodes' fields, where validation read them already.
    nodes: list[NodeFields] | None = None
    # Filled by read(): each node's name in the plan (unnamed nodes get one), in graph order,
    # and the names that differ from the proto's, by node number (from 1).
    node_names: list[str] = field(default_factory=list)
    renamed_nodes: dict[int, str] = field(default_factory=dict)
    # Each typed value's TypeProto, serialised (the writer builds value_info from them).
    type_bytes: dict[str, bytes] = field(default_factory=dict)
    # Initializers whose data ``proto`` does not hold: where it is in the model file
    # (graphamp.onnx.infile); their TensorProtos have name, type and dims only.
    weights: dict[str, InFileTensor] = field(default_factory=dict)
    repaired: str = ""  # what graphamp.onnx.declared repaired in ``proto`` ("" for nothing)
    # The model kept weights in external data files: the converted one does too.
    external: bool = False


def suits(proto: onnx.ModelProto, *, subgraphs: bool | None = None) -> bool:
    """Whether ``proto`` can be converted without onnx_ir: no subgraph (``subgraphs``: what
    validation found, else looked for here), no model-local function, no graph output that is
    a graph input or a weight (renaming it for an output Cast would rename the input)."""
    graph = proto.graph
    if proto.functions:
        return False
    stored = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    if any(o.name in stored for o in graph.output):
        return False
    if subgraphs is not None:
        return not subgraphs
    for node in graph.node:
        if node.op_type in slots.CONTROL_FLOW_OPS or any(
            a.type in _SUBGRAPHS for a in node.attribute
        ):
            return False
    return True


def read(model: ProtoModel, target: str, provider: str = "any") -> ReadGraph:
    """The OpGraph of ``model``'s graph, as :func:`graphamp.onnx.reader.read` gives it."""
    graph = model.proto.graph
    opsets = {entry.domain: entry.version for entry in model.proto.opset_import}
    op_graph = OpGraph(graph.name or "graph")
    nodes = model.nodes if model.nodes is not None else node_fields(graph)
    model.nodes = None  # its lists become the OpGraph's, which passes change
    model.node_names, model.renamed_nodes = _node_names(nodes)
    initializers = {init.name: init for init in graph.initializer}
    # what of the external data scanned stays cached for the writer to read again
    budget = stream.CacheBudget() if model.external else None
    typed = _Types(model.types, model.type_bytes, model.weights, budget)
    for value in graph.input:
        op_graph.add_tensor(typed.tensor(value.name, initializers.get(value.name), True))
    for name, init in initializers.items():
        if name not in op_graph.tensors:
            op_graph.add_tensor(typed.tensor(name, init, False))
    tensors = op_graph.tensors
    _read_nodes(op_graph, nodes, model.node_names, typed, opsets, target, provider)
    for value in graph.output:
        op_graph.graph_outputs.append(value.name)
        tensors[value.name].is_graph_output = True
    inputs = [v.name for v in graph.input]
    op_graph.graph_inputs = [n for n in inputs if n not in initializers] + [
        n for n in inputs if n in initializers
    ]
    if not any(t.is_float for t in tensors.values()):
        raise GraphampError("the model computes on no floating-point tensor: nothing to convert")
    op_graph.fused_kernels = fusion.fused_kernels(opsets, target, provider, tensors)
    return ReadGraph(op_graph, model, None)


def _node_names(nodes: list[NodeFields]) -> tuple[list[str], dict[int, str]]:
    """As the onnx_ir reader names them: ``<op>__<first output>`` for an unnamed node, a
    suffix for a name an earlier node has. (every name, the new ones by node number)"""
    given = [node.name for node in nodes]
    taken = set(given)
    if len(taken) == len(given) and "" not in taken:
        return given, {}  # every node named, and each once (the common case)
    taken.discard("")
    seen: set[str] = set()
    names = []
    renamed = {}
    for index, node in enumerate(nodes, 1):
        name = node.name
        if not name:
            first = next((v for v in node.outputs if v), "")
            name = unique_name(f"{node.op_type}__{first}" if first else node.op_type, taken)
            renamed[index] = name
        elif name in seen:
            name = renamed[index] = unique_name(name, taken)
        seen.add(name)
        names.append(name)
    return names, renamed


class _Types:
    """Value types and shapes from the serialised TypeProtos; each distinct one is parsed
    once (a chain of 50,000 nodes may have one)."""

    def __init__(
        self,
        types: dict[str, bytes],
        type_bytes: dict[str, bytes],
        weights: dict[str, InFileTensor],
        budget: stream.CacheBudget | None = None,
    ) -> None:
        self.types = types
        self.type_bytes = type_bytes
        self.weights = weights
        self.budget = budget
        self.known: dict[bytes, tuple[str, tuple[int | str | None, ...] | None]] = {}

    def of(self, name: str) -> tuple[str, tuple[int | str | None, ...] | None]:
        key = self.types.get(name)
        if key is None:
            return UNKNOWN, None
        self.type_bytes[name] = key
        found = self.known.get(key)
        if found is None:
            found = self.known[key] = _type_and_shape(onnx.TypeProto.FromString(key))
        return found

    def add_outputs(self, outputs: list[str], op_graph: OpGraph) -> tuple[str, ...]:
        """Add a node's outputs to ``op_graph``; their types ("unknown" for one left out)."""
        types = []
        for name in outputs:
            if name:
                dtype, shape = self.of(name)
                op_graph.add_tensor(TensorInfo(name, dtype, shape))
                types.append(dtype)
            else:
                types.append(UNKNOWN)
        return tuple(types)

    def tensor(self, name: str, init: onnx.TensorProto | None, graph_input: bool) -> TensorInfo:
        dtype, shape = self.of(name)
        tensor = TensorInfo(name=name, dtype=dtype, shape=shape, is_graph_input=graph_input)
        if init is not None:
            in_file = self.weights.get(name)
            if in_file is not None:  # mapped when read; left unread when speculating
                tensor.load_value = functools.partial(in_file.numpy, self.budget)
                tensor.on_disk = True
            else:
                tensor.load_value = functools.partial(numpy_helper.to_array, init)
            if dtype == UNKNOWN:
                tensor.dtype = elem_name(init.data_type)
            if shape is None:
                tensor.shape = tuple(int(d) for d in init.dims)
        return tensor


def _type_and_shape(type_: onnx.TypeProto) -> tuple[str, tuple[int | str | None, ...] | None]:
    """A tensor's element type and shape; a sequence's or an optional's element type (as
    onnx_ir gives a value's dtype) and no shape."""
    which = type_.WhichOneof("value")
    if which == "tensor_type":
        tensor_type = type_.tensor_type
        shape = None
        if tensor_type.HasField("shape"):
            shape = tuple(_dim(d) for d in tensor_type.shape.dim)
        return elem_name(tensor_type.elem_type), shape
    if which == "sequence_type" and type_.sequence_type.HasField("elem_type"):
        return _type_and_shape(type_.sequence_type.elem_type)[0], None
    if which == "optional_type" and type_.optional_type.HasField("elem_type"):
        return _type_and_shape(type_.optional_type.elem_type)[0], None
    return UNKNOWN, None


def _dim(dim: onnx.TensorShapeProto.Dimension) -> int | str | None:
    which = dim.WhichOneof("value")
    return dim.dim_value if which == "dim_value" else (dim.dim_param if which else None)


def elem_name(elem_type: int) -> str:
    """The engine's name of an ONNX element type ("unknown" for 0, undefined)."""
    if not elem_type:
        return UNKNOWN
    return dtypes.from_onnx(elem_type) or onnx.TensorProto.DataType.Name(elem_type).lower()


def _read_nodes(
    op_graph: OpGraph,
    nodes: list[NodeFields],
    names: list[str],
    typed: _Types,
    opsets: dict[str, int],
    target: str,
    provider: str,
) -> None:
    """Add each node, and the values it produces, to ``op_graph`` in graph order.

    The loop runs once per node (50,000 times on the benchmark's chain), so it does only what
    differs per node; what the nodes of one signature share (their slots, from the schema) is
    settled once per signature by :func:`slots.computing_node`."""
    tensors = op_graph.tensors
    source = f"opset {opsets.get('', 0)}"
    signatures: dict[tuple[object, ...], slots.Slots] = {}
    kernels_known = provider in kernels.PROVIDERS  # missing_kernel says "" for any other
    add_node, add_outputs = op_graph.add_node, typed.add_outputs
    op_name, scope_of, default_domains = slots.op_name, module_path_of_entries, DEFAULT_DOMAINS
    for name, fields in zip(names, nodes, strict=True):
        _, op_type, domain, inputs, outputs, listed, metadata = fields
        # the types the model or inference declares (the fallback below fills the others)
        output_types = add_outputs(outputs, op_graph)
        op_node = OpNode(
            name,
            op_name(op_type, domain),
            inputs,
            outputs,
            domain=domain,
            scope=(scope_of(metadata) if metadata else "") or name,
            schema_source=source,
        )
        if op_type in _CAST_OR_CONSTANT and domain in default_domains:
            _read_cast_or_constant(op_node, op_type, listed, tensors)
        else:
            attribute = _attribute_of(listed) if listed else _no_attribute
            slots.computing_node(
                op_node, op_type, tensors, output_types, opsets, target, signatures, attribute
            )
            if kernels_known and (op_node.follow_inputs or op_node.follow_outputs):
                op_node.no_kernel = kernels.missing_kernel(
                    provider, domain, op_type, slots.opset_of(opsets, domain), target
                )
        add_node(op_node)
        # (a Constant's output took its value's type above, which may be none)
        if UNKNOWN in output_types or op_node.kind is NodeKind.CONSTANT:
            for slot, output in enumerate(outputs):
                if output and tensors[output].dtype == UNKNOWN:
                    fallback = slots.output_type_fallback(op_node, op_type, slot, opsets)
                    tensors[output].dtype = fallback or UNKNOWN


def _read_cast_or_constant(
    op_node: OpNode,
    op_type: str,
    listed: Sequence[onnx.AttributeProto],
    tensors: dict[str, TensorInfo],
) -> None:
    attributes = {a.name: a for a in listed}
    if op_type == "Cast":
        op_node.kind = NodeKind.CAST
        op_node.cast_to = elem_name(attributes["to"].i)
    else:
        op_node.kind = NodeKind.CONSTANT
        _attach_constant(tensors[op_node.outputs[0]], attributes)


def _attribute_of(listed: Sequence[onnx.AttributeProto]) -> slots.AttributeValue:
    """A node's attribute getter (``listed``: its repeated AttributeProto field)."""

    def attribute(key: str) -> object:
        # (few nodes ask, so no table of them is built per node; the last of a name counts)
        found = None
        for listed_attribute in listed:
            if listed_attribute.name == key:
                found = listed_attribute
        return onnx.helper.get_attribute_value(found) if found is not None else None

    return attribute


def _no_attribute(key: str) -> object:
    """The attribute getter of a node without attributes."""
    return None


def _attach_constant(tensor: TensorInfo, attributes: dict[str, onnx.AttributeProto]) -> None:
    if "value" in attributes and attributes["value"].type == onnx.AttributeProto.TENSOR:
        const = attributes["value"].t
        tensor.load_value = functools.partial(numpy_helper.to_array, const)
        tensor.dtype = elem_name(const.data_type)
    elif "value_float" in attributes:
        value = attributes["value_float"].f
        tensor.load_value = lambda: np.array(value, np.float32)
        tensor.dtype = "float32"
    elif "value_floats" in attributes:
        values = list(attributes["value_floats"].floats)
        tensor.load_value = lambda: np.array(values, np.float32)
        tensor.dtype = "float32"
