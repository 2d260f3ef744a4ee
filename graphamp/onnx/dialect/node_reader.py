"""Reading a graph's nodes into the OpGraph, once per node, and naming them.

:func:`read_nodes` adds a run of plain nodes (none owns a body) and the values they produce;
the types come from the serialised TypeProtos the reader found (:class:`Types`, each distinct
one parsed once), with a local fallback from the op schemas (an output bound to the same type
variable as a typed input, Cast's ``to``, fixed output types), so a tensor that inference
missed still gets its casts. An unnamed node is named ``<op>__<first output>`` and a repeated
name gets a suffix (:func:`node_names`): the plan names each node once, and the writer gives
the output model's nodes those names.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from graphamp.core import dtypes
from graphamp.core.dtypes import UNKNOWN
from graphamp.core.graph import NodeKind, OpGraph, OpNode, TensorInfo, unique_name
from graphamp.onnx.dialect import kernels, slots
from graphamp.onnx.dialect.scopes import module_path_of_entries
from graphamp.onnx.io import stream
from graphamp.onnx.io.infile import InFileTensor
from graphamp.onnx.io.subgraphs import bodies
from graphamp.onnx.validation.validate_nodes import DEFAULT_DOMAINS, NodeFields, node_fields

_SUBGRAPHS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_CAST_OR_CONSTANT = frozenset({"Cast", "Constant"})


def names_outside(proto: onnx.ModelProto) -> set[str]:
    """Every node and value name inside the model's subgraphs and functions: a name graphamp
    adds must differ from them too (ONNX names a value once in the whole model)."""
    names: set[str] = set()

    def add_graph(graph: onnx.GraphProto) -> None:
        names.update(value.name for value in graph.input if value.name)
        add_nodes(graph.node)

    def add_nodes(nodes: Sequence[onnx.NodeProto]) -> None:
        for node in nodes:
            if node.name:
                names.add(node.name)
            names.update(out for out in node.output if out)
            for body in bodies(node):
                add_graph(body)

    for node in proto.graph.node:
        for body in bodies(node):
            add_graph(body)
    for function in proto.functions:
        names.update(name for name in (*function.input, *function.output) if name)
        add_nodes(function.node)
    return names


def named_function(function: onnx.FunctionProto) -> onnx.FunctionProto:
    """``function`` with its unnamed nodes, and those of every graph in it, named as the
    reader names a graph's (a copy; ``function`` itself where every node has a name)."""
    if all(_all_named(node) for node in function.node):
        return function
    named = onnx.FunctionProto()
    named.CopyFrom(function)
    _name_graph_nodes(named.node)
    return named


def _all_named(node: onnx.NodeProto) -> bool:
    return bool(node.name) and all(
        _all_named(inner) for body in bodies(node) for inner in body.node
    )


def _name_graph_nodes(nodes: Sequence[onnx.NodeProto]) -> None:
    """Name the unnamed (and repeated) nodes of a graph, then those of every graph in it."""
    _, renamed = node_names(node_fields_of(nodes))
    for number, name in renamed.items():
        nodes[number - 1].name = name
    for node in nodes:
        for body in bodies(node):
            _name_graph_nodes(body.node)


def node_fields_of(nodes: Sequence[onnx.NodeProto]) -> list[NodeFields]:
    """:class:`NodeFields` of ``nodes`` (a function's, say)."""
    graph = onnx.GraphProto()
    graph.node.extend(nodes)
    return node_fields(graph)


def node_names(nodes: list[NodeFields]) -> tuple[list[str], dict[int, str]]:
    """Names for a graph's nodes: ``<op>__<first output>`` for an unnamed node, a suffix for
    a name an earlier node has. (every name, the new ones by node number)"""
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


class Types:
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

    def add_outputs(self, outputs: list[str], op_graph: OpGraph, body: str) -> tuple[str, ...]:
        """Add a node's outputs (in ``body``) to ``op_graph``; their types ("unknown" for
        one left out)."""
        types = []
        for name in outputs:
            if name:
                dtype, shape = self.of(name)
                op_graph.add_tensor(TensorInfo(name, dtype, shape, None, body))
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


def read_nodes(
    op_graph: OpGraph,
    nodes: list[NodeFields],
    names: list[str],
    paths: list[str],
    typed: Types,
    opsets: dict[str, int],
    target: str,
    provider: str,
    signatures: dict[tuple[object, ...], slots.Slots],
    body: str,
) -> None:
    """Add each node, and the values it produces, to ``op_graph`` in graph order (``nodes``
    with OpGraph names of values, ``names`` the nodes' own, ``paths`` their OpGraph names: the
    same list in the main graph; ``body`` the path of the body they are in).

    The loop runs once per node (50,000 times on the benchmark's chain), so it does only what
    differs per node; what the nodes of one signature share (their slots, from the schema) is
    settled once per signature by :func:`slots.computing_node`."""
    tensors = op_graph.tensors
    source = f"opset {opsets.get('', 0)}"
    kernels_known = provider in kernels.PROVIDERS  # missing_kernel says "" for any other
    add_node, add_outputs = op_graph.add_node, typed.add_outputs
    op_name, scope_of, default_domains = slots.op_name, module_path_of_entries, DEFAULT_DOMAINS
    for name, path, fields in zip(names, paths, nodes, strict=True):
        _, op_type, domain, inputs, outputs, listed, metadata = fields
        # the types the model or inference declares (the fallback below fills the others)
        output_types = add_outputs(outputs, op_graph, body)
        op_node = OpNode(
            path,
            op_name(op_type, domain),
            inputs,
            outputs,
            domain=domain,
            scope=(scope_of(metadata) if metadata else "") or name,
            schema_source=source,
            body=body,
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
