"""One graph of a model being edited by the ONNX writer: the main graph, an If/Loop/Scan body
or a model-local function's copy at one call site.

Node order is a doubly linked list of node numbers (the input's nodes numbered from 1 in graph
order, added ones after them), as onnx_ir keeps it: inserting or moving a node costs nothing
whatever the graph's size. Only the nodes an edit touches are copied; the others are the
input's own messages, copied once into the output by protobuf. The input's protos are never
changed.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx

from graphamp.core import dtypes
from graphamp.errors import InternalError
from graphamp.onnx.dialect.handles import Scope
from graphamp.onnx.io import stream, wire
from graphamp.onnx.io.subgraphs import bodies
from graphamp.plans.records import WeightRecord

HEAD = 0  # the list's sentinel: nodes are numbered from 1
# What number HEAD holds in GraphEdit.nodes: no node of any graph (never written, never changed).
_NO_NODE = onnx.NodeProto()


class GraphEdit:
    """The nodes of one graph, in their (changing) order, and what changes in it besides."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.nodes: list[onnx.NodeProto] = [_NO_NODE, *scope.graph.node]
        self.changed: set[int] = set()
        count = len(self.nodes)
        self.next = [*range(1, count), HEAD]
        self.prev = [count - 1, *range(count - 1)]
        # The outputs of the nodes made or renamed here, by number (local names).
        self.outputs: dict[int, list[str]] = {}
        self.initializers: dict[str, onnx.TensorProto] = {}  # converted in place
        self.new_initializers: list[onnx.TensorProto] = []
        self.dropped: set[str] = set()  # initializers only replaced nodes read
        # A body's results rewired: position -> the value it returns (local name).
        self.results: dict[int, str] = {}
        for number, name in scope.renamed.items():
            self.node(number).name = name

    def node(self, index: int) -> onnx.NodeProto:
        """Node ``index``, copied before its first change (the input is never changed)."""
        assert index != HEAD, index  # number 0 is no node (numbers start at 1)
        node = self.nodes[index]
        if index not in self.changed:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            self.nodes[index] = node = copy
            self.changed.add(index)
        return node

    def add(self, node: onnx.NodeProto, after: int) -> int:
        """Add ``node`` (a new message, owned here) right after node ``after`` (HEAD: first);
        its number."""
        index = len(self.nodes)
        self.nodes.append(node)
        self.next.append(HEAD)
        self.prev.append(HEAD)
        self.changed.add(index)
        self.link_after(after, index)
        return index

    def link_after(self, before: int, index: int) -> None:
        after = self.next[before]
        self.next[before], self.prev[index] = index, before
        self.next[index], self.prev[after] = after, index

    def unlink(self, index: int) -> None:
        before, after = self.prev[index], self.next[index]
        self.next[before], self.prev[after] = after, before

    def order(self) -> list[int]:
        """The node numbers in graph order."""
        order = []
        index = self.next[HEAD]
        while index != HEAD:
            order.append(index)
            index = self.next[index]
        return order

    def write_nodes(self, graph: onnx.GraphProto, order: list[int]) -> None:
        del graph.node[:]
        graph.node.extend(self.nodes[index] for index in order)

    def write_initializers(self, graph: onnx.GraphProto) -> None:
        if self.dropped:
            kept = [init for init in graph.initializer if init.name not in self.dropped]
            del graph.initializer[:]
            graph.initializer.extend(kept)
        if self.initializers:
            for position, init in enumerate(graph.initializer):
                if init.name in self.initializers:
                    graph.initializer[position].CopyFrom(self.initializers[init.name])
        graph.initializer.extend(self.new_initializers)


def write_value_info(
    graph: onnx.GraphProto,
    source: onnx.GraphProto,
    produced: list[str],
    type_of: TypeOf,
    named: dict[str, str] | None = None,
) -> None:
    """``graph``'s value_info: the entries ``source`` (the input's graph) has for values still
    in it, in their order (a model onnx_ir wrote comes back as it was), then every other typed
    value of ``produced`` (the node outputs in node order), each with its type now
    (``type_of``, by OpGraph name: ``named`` maps a body's local names to them; an untyped
    value gets no entry).

    Written as wire-format bytes that protobuf parses in one call: each entry is its name and
    a TypeProto, serialised once per distinct type (a Cast's output has its input's shape);
    building 50,000 messages field by field took a quarter second."""
    outputs = {value.name for value in graph.output}
    inputs = {value.name for value in graph.input}
    produced = [name for name in produced if name not in outputs]
    weights = [init.name for init in graph.initializer if init.name not in inputs]
    names: dict[str, None] = {}
    if source.value_info:
        wanted = set(produced) | set(weights)
        names.update((info.name, None) for info in source.value_info if info.name in wanted)
    names.update(dict.fromkeys(produced))
    varint = wire.varint
    # (TypeOf.field, inline: this loop runs once per value, 50,000 times on the chain)
    type_bytes, types, shapes, fields = (
        type_of.type_bytes,
        type_of.types,
        type_of.shapes,
        type_of.fields,
    )
    chunks: list[bytes] = []
    for name in names:
        key_name = named.get(name, name) if named else name
        key = (type_bytes.get(shapes.get(key_name, key_name)), types.get(key_name))
        type_field = fields.get(key)
        if type_field is None:
            type_field = fields[key] = _type_field(*key)
        if not type_field:  # a value of no known type
            continue
        encoded = name.encode()
        name_length = varint(len(encoded))
        size = 1 + len(name_length) + len(encoded) + len(type_field)
        # GraphProto.value_info (field 13), holding ValueInfoProto.name (1) and type (2)
        chunks += (b"j", varint(size), b"\n", name_length, encoded, type_field)
    del graph.value_info[:]
    graph.MergeFromString(b"".join(chunks))


class TypeOf:
    """The ValueInfoProto ``type`` field (field 2, serialised) of each value of a graph as
    written: the TypeProto the reader found for it (``type_bytes``; a new value takes the one
    of the value whose shape it has, ``shapes``) with the element type of a retyped value
    (``types``); each distinct one built once."""

    def __init__(
        self, type_bytes: dict[str, bytes], types: dict[str, int], shapes: dict[str, str]
    ) -> None:
        self.type_bytes, self.types, self.shapes = type_bytes, types, shapes
        self.fields: dict[tuple[bytes | None, int | None], bytes] = {}

    def field(self, name: str) -> bytes:
        key = (self.type_bytes.get(self.shapes.get(name, name)), self.types.get(name))
        found = self.fields.get(key)
        if found is None:
            found = self.fields[key] = _type_field(*key)
        return found

    def type_proto(self, name: str) -> onnx.TypeProto | None:
        """The value's TypeProto as written (None for a value of no known type)."""
        found = self.field(name)
        if not found:
            return None
        holder = onnx.ValueInfoProto.FromString(found)
        return holder.type


def _type_field(type_bytes: bytes | None, new_type: int | None) -> bytes:
    """ValueInfoProto.type (field 2) for a value whose TypeProto serialises as ``type_bytes``
    (None: unknown) and whose element type becomes ``new_type`` (None: stays); b"" where
    neither says anything (the value gets no entry)."""
    if new_type is not None:
        type_ = onnx.TypeProto.FromString(type_bytes or b"")
        type_.tensor_type.elem_type = new_type
        type_bytes = type_.SerializeToString()
    return wire.field(2, type_bytes) if type_bytes is not None else b""


def write_io_types(
    values: list[onnx.ValueInfoProto],
    declared: dict[str, onnx.ValueInfoProto],
    types: dict[str, int],
    type_bytes: dict[str, bytes],
) -> None:
    """A graph's inputs or outputs: the shape inference found where the model gave none (as
    onnx_ir writes it), else the one the reader found (a loop's final value's: the shape it
    has at entry and in the body), and a retyped value's element type."""
    for value in values:
        known = declared.get(value.name)
        if (
            known is not None
            and known is not value
            and not value.type.tensor_type.HasField("shape")
        ):
            value.CopyFrom(known)
        found = type_bytes.get(value.name)
        if found is not None and not value.type.tensor_type.HasField("shape"):
            reader_type = onnx.TypeProto.FromString(found).tensor_type
            if reader_type.HasField("shape"):
                value.type.tensor_type.shape.CopyFrom(reader_type.shape)
        if value.name in types:
            value.type.tensor_type.elem_type = types[value.name]


def constant_value(node: onnx.NodeProto) -> onnx.TensorProto:
    """The value a Constant node stores, as a tensor (value_float(s) are float32)."""
    for attribute in node.attribute:
        if attribute.name == "value" and attribute.type == onnx.AttributeProto.TENSOR:
            return attribute.t
        if attribute.name in ("value_float", "value_floats"):
            return onnx.numpy_helper.from_array(
                np.array(onnx.helper.get_attribute_value(attribute), np.float32)
            )
    raise InternalError(f"weight {node.output[0]!r} has no stored value")


def converted_tensor(stored: onnx.TensorProto, record: WeightRecord) -> onnx.TensorProto:
    """``stored`` rounded to ``record.dst``, chunk by chunk as the streaming writers round it
    (the counts go into ``record``): type, dims and raw_data, as onnx_ir serialises a tensor."""
    values = onnx.numpy_helper.to_array(stored)
    chunks = stream.converted_chunks(stream.array_chunks(values), record.dst, record.name, record)
    converted = onnx.TensorProto(data_type=dtypes.BY_NAME[record.dst].onnx)
    converted.dims.extend(stored.dims)
    converted.raw_data = b"".join(stream.bytes_of(chunk) for chunk in chunks)
    return converted


def set_attribute(node: onnx.NodeProto, attribute: onnx.AttributeProto) -> None:
    """Set or replace (in its place) the attribute of that name, as onnx_ir's dict does."""
    for existing in node.attribute:
        if existing.name == attribute.name:
            existing.CopyFrom(attribute)
            return
    node.attribute.append(attribute)


@functools.cache
def cast_to(dtype: str) -> onnx.NodeProto:
    """A Cast to ``dtype`` with no name, input or output yet (protobuf writes fields in number
    order, so the Casts copied from it serialise as ones built field by field)."""
    cast = onnx.NodeProto(op_type="Cast")
    cast.attribute.add(name="to", type=onnx.AttributeProto.INT, i=dtypes.BY_NAME[dtype].onnx)
    return cast


def rename_reads(graph: GraphEdit, old: str, new: str, *, deep: bool) -> None:
    """Make the nodes of ``graph`` that read ``old`` read ``new`` (``deep``: inside the
    bodies of a node kept whole too)."""
    for index, node in enumerate(graph.nodes):
        if index == HEAD:
            continue
        if old in node.input or (deep and _reads_inside(node, old)):
            read_renamed(graph.node(index), {old: new}, inside_only=False)


def _reads_inside(node: onnx.NodeProto, name: str) -> bool:
    return any(
        name in inner.input or _reads_inside(inner, name)
        for body in bodies(node)
        for inner in body.node
    )


def read_renamed(node: onnx.NodeProto, renamed: dict[str, str], *, inside_only: bool) -> None:
    """``node`` reads each value of ``renamed`` by its new name, in its bodies too
    (``inside_only``: only there); a body that defines a name itself reads its own."""
    if not inside_only:
        for slot, name in enumerate(node.input):
            if name in renamed:
                node.input[slot] = renamed[name]
    for body in bodies(node):
        defined = {v.name for v in body.input} | {t.name for t in body.initializer}
        defined.update(out for inner in body.node for out in inner.output)
        inside = {old: new for old, new in renamed.items() if old not in defined}
        if not inside:
            continue
        for inner in body.node:
            read_renamed(inner, inside, inside_only=False)
        for value in body.output:
            if value.name in inside:
                value.name = inside[value.name]
