"""Applying an edit script to a copy of a ``ModelProto`` (the model :mod:`proto_reader` read).

The same edits, in the same order, as :mod:`graphamp.onnx.writer` makes on an onnx_ir model,
so the output is the same model: an inserted Cast goes right after its producer (before
everything, for a graph input or a weight), a model Cast that is hoisted moves right after the
producer of its input. Node order is kept in a doubly linked list of node numbers, as onnx_ir
keeps it; only the nodes an edit touches are copied, the rest are the input's own messages,
copied once into the output by protobuf. Value types go into ``value_info`` for every typed
node output, as onnx_ir writes them. A weight the reader left in the model file
(:mod:`graphamp.onnx.infile`) stays there: the output holds it data-less, and the
:class:`~graphamp.onnx.infile.StreamedModel` returned reads (and rounds) it as it is written.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx

from graphamp.core import dtypes
from graphamp.core.graph import OpGraph
from graphamp.dialects.base import ReadGraph
from graphamp.errors import InternalError
from graphamp.onnx import slots, stream, wire
from graphamp.onnx.infile import Converted, Data, StreamedModel
from graphamp.onnx.proto_reader import ProtoModel
from graphamp.onnx.slots import CONSTANT_FLOAT_ATTRIBUTES, LOW_PRECISION_ATTRIBUTES
from graphamp.plans.edits import EditScript
from graphamp.plans.records import RewriteRecord, WeightRecord

_HEAD = 0  # the list's sentinel: nodes are numbered from 1
# The ops (as the OpGraph names them) that may need an attribute to run low: a node of another
# op is not looked up in LOW_PRECISION_ATTRIBUTES.
_LOW_PRECISION_OPS = frozenset(
    slots.op_name(op, domain) for domain, op, _ in LOW_PRECISION_ATTRIBUTES
)


def apply(read: ReadGraph, script: EditScript) -> onnx.ModelProto | StreamedModel:
    """The converted model: a new proto; ``read.model``'s proto is not changed. A model read
    with its weights left in the file gives a :class:`~graphamp.onnx.infile.StreamedModel`:
    those weights are read, and converted, as it is written."""
    model: ProtoModel = read.model
    if script.new_nodes or script.new_inputs or any(slot < 0 for _, slot in script.rewire):
        raise InternalError("the ONNX dialect adds no training nodes and reads no subgraphs")
    edit = _Edit(model, read.graph)
    for rewrite in script.rewrites:
        edit.rewrite(rewrite)
    edit.weights(script)
    onnx_types = {d: dtypes.BY_NAME[d].onnx for d in set(script.retype.values())}
    edit.types.update({name: onnx_types[d] for name, d in script.retype.items()})
    for record in script.casts:
        edit.insert_cast(record.tensor, record.dst, record.output)
    for record in script.output_casts:  # before rewiring: float32 readers read the Cast back
        node = script.cast_nodes.get(record.output, record.output)
        edit.output_cast(record.tensor, record.dst, record.output, node)
    for (node_name, slot), tensor in script.rewire.items():
        edit.node(edit.number[node_name]).input[slot] = tensor
    for node_name in script.hoist_casts:
        edit.hoist(edit.number[node_name])
    graph_nodes = read.graph.nodes
    for node_name, low in script.low_nodes.items():
        if graph_nodes[node_name].op not in _LOW_PRECISION_OPS:  # (its proto's fields cost more)
            continue
        index = edit.number[node_name]
        source = edit.nodes[index]
        needs = LOW_PRECISION_ATTRIBUTES.get((source.domain, source.op_type, low), {})  # type: ignore[union-attr]
        for name, dtype in needs.items():
            attribute = onnx.helper.make_attribute(name, dtypes.BY_NAME[dtype].onnx)
            _set_attribute(edit.node(index), attribute)
    for node_name, dtype in script.retarget_casts.items():
        node = edit.node(edit.number[node_name])
        _set_attribute(node, onnx.helper.make_attribute("to", dtypes.BY_NAME[dtype].onnx))
    for node_name in script.remove_nodes:
        edit.unlink(edit.number[node_name])
    return edit.finish()


def _constant_value(node: onnx.NodeProto) -> onnx.TensorProto:
    """The value a Constant node stores, as a tensor (value_float(s) are float32)."""
    for attribute in node.attribute:
        if attribute.name == "value" and attribute.type == onnx.AttributeProto.TENSOR:
            return attribute.t
        if attribute.name in ("value_float", "value_floats"):
            return onnx.numpy_helper.from_array(
                np.array(onnx.helper.get_attribute_value(attribute), np.float32)
            )
    raise InternalError(f"weight {node.output[0]!r} has no stored value")


def _converted(stored: onnx.TensorProto, record: WeightRecord) -> onnx.TensorProto:
    """``stored`` rounded to ``record.dst``, chunk by chunk as the streaming writers round it
    (the counts go into ``record``): type, dims and raw_data, as onnx_ir serialises a tensor."""
    values = onnx.numpy_helper.to_array(stored)
    chunks = stream.converted_chunks(stream.array_chunks(values), record.dst, record.name, record)
    converted = onnx.TensorProto(data_type=dtypes.BY_NAME[record.dst].onnx)
    converted.dims.extend(stored.dims)
    converted.raw_data = b"".join(stream.bytes_of(chunk) for chunk in chunks)
    return converted


@functools.cache
def _cast_to(dtype: str) -> onnx.NodeProto:
    """A Cast to ``dtype`` with no name, input or output yet (protobuf writes fields in number
    order, so the Casts copied from it serialise as ones built field by field)."""
    cast = onnx.NodeProto(op_type="Cast")
    cast.attribute.add(name="to", type=onnx.AttributeProto.INT, i=dtypes.BY_NAME[dtype].onnx)
    return cast


def _type_field(type_bytes: bytes | None, new_type: int | None) -> bytes:
    """ValueInfoProto.type (field 2) for a value whose TypeProto serialises as ``type_bytes``
    (None: unknown) and whose element type becomes ``new_type`` (None: stays); b"" where
    neither says anything (the value gets no entry)."""
    if new_type is not None:
        type_ = onnx.TypeProto.FromString(type_bytes or b"")
        type_.tensor_type.elem_type = new_type
        type_bytes = type_.SerializeToString()
    return wire.field(2, type_bytes) if type_bytes is not None else b""


def _set_attribute(node: onnx.NodeProto, attribute: onnx.AttributeProto) -> None:
    """Set or replace (in its place) the attribute of that name, as onnx_ir's dict does."""
    for existing in node.attribute:
        if existing.name == attribute.name:
            existing.CopyFrom(attribute)
            return
    node.attribute.append(attribute)


class _Edit:
    """The output being built: the node list, the nodes changed so far, value types."""

    def __init__(self, model: ProtoModel, graph: OpGraph) -> None:
        self.model = model
        self.source = model.proto.graph
        self.domains: set[str] = set()  # domains of the fused ops written
        self.nodes: list[onnx.NodeProto | None] = [None, *self.source.node]
        self.changed: set[int] = set()
        count = len(self.nodes)
        self.next = [*range(1, count), _HEAD]
        self.prev = [count - 1, *range(count - 1)]
        self.number = dict(zip(model.node_names, range(1, count), strict=True))
        self.tensors = graph.tensors  # producers of the input's values
        # The outputs of the nodes made or renamed here, by number; every other node's are the
        # lists the reader gave the OpGraph (a repeated field of a proto costs more to read).
        self.outputs: dict[int, list[str]] = {}
        self.graph_nodes = graph.nodes
        self.producer: dict[str, int] = {}  # producers of values made or renamed here
        for index, name in model.renamed_nodes.items():
            self.node(index).name = name
        self.types: dict[str, int] = {}  # value -> new element type
        self.shapes: dict[str, str] = {}  # new value -> the value whose shape it has
        self.initializers: dict[str, onnx.TensorProto] = {}  # converted in place
        self.new_initializers: list[onnx.TensorProto] = []
        self.streamed: dict[str, Data] = {}  # converted weights whose data is in the file
        self.dropped: set[str] = set()  # initializers only replaced nodes read

    def node(self, index: int) -> onnx.NodeProto:
        """Node ``index``, copied before its first change (the input is never changed)."""
        node = self.nodes[index]
        if index not in self.changed:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            self.nodes[index] = node = copy
            self.changed.add(index)
        return node  # type: ignore[return-value]

    def link_after(self, before: int, index: int) -> None:
        after = self.next[before]
        self.next[before], self.prev[index] = index, before
        self.next[index], self.prev[after] = after, index

    def unlink(self, index: int) -> None:
        before, after = self.prev[index], self.next[index]
        self.next[before], self.prev[after] = after, before

    def producer_of(self, tensor: str) -> int:
        """The number of the node producing ``tensor``; _HEAD for a graph input or weight."""
        found = self.producer.get(tensor)
        if found is not None:
            return found
        info = self.tensors.get(tensor)
        return self.number[info.producer] if info is not None and info.producer else _HEAD

    def place(self, index: int, tensor: str) -> None:
        """Right after the producer of ``tensor``; first of all for a graph input or weight."""
        self.link_after(self.producer_of(tensor), index)

    def insert_cast(self, tensor: str, dtype: str, output: str, node: str = "") -> None:
        cast = onnx.NodeProto()
        cast.CopyFrom(_cast_to(dtype))  # (copying op_type and attribute costs less than setting)
        cast.name = node or output
        cast.input.append(tensor)
        cast.output.append(output)
        index = len(self.nodes)
        self.nodes.append(cast)
        self.next.append(_HEAD)
        self.prev.append(_HEAD)
        self.changed.add(index)
        self.place(index, tensor)
        self.producer[output] = index
        self.outputs[index] = [output]
        self.types[output] = dtypes.BY_NAME[dtype].onnx
        self.shapes[output] = tensor

    def output_cast(self, low: str, dtype: str, output: str, cast_name: str) -> None:
        """Graph output ``output`` becomes ``low`` (every reader follows), read by a Cast
        (node ``cast_name``) back to ``dtype`` whose output is ``output``."""
        producer = self.producer_of(output)
        node = self.node(producer)
        node.output[list(node.output).index(output)] = low
        self.outputs[producer] = list(node.output)
        self.producer[low] = producer
        for index, node in enumerate(self.nodes):  # onnx_ir renames the value its readers read
            if node is not None and output in node.input:
                node = self.node(index)
                for slot, name in enumerate(node.input):
                    if name == output:
                        node.input[slot] = low
        self.types[low] = self.types.get(output, self._declared_type(output))
        self.shapes[low] = output
        self.insert_cast(low, dtype, output, cast_name)

    def rewrite(self, record: RewriteRecord) -> None:
        """The fused node in place of the last node it replaces; the others unlinked."""
        node = onnx.helper.make_node(
            record.op,
            record.inputs,
            record.outputs,
            name=record.node,
            domain=record.domain or None,
            **record.attributes,
        )
        index = len(self.nodes)
        self.nodes.append(node)
        self.next.append(_HEAD)
        self.prev.append(_HEAD)
        self.changed.add(index)
        last = self.number[record.replaces[-1]]
        self.link_after(self.prev[last], index)
        for name in record.replaces:
            self.unlink(self.number[name])
        self.number[record.node] = index
        for output in filter(None, record.outputs):
            self.producer[output] = index
        self.outputs[index] = list(record.outputs)
        self.dropped.update(record.drops)
        if record.domain:
            self.domains.add(record.domain)

    def hoist(self, index: int) -> None:
        self.unlink(index)
        self.place(index, self.nodes[index].input[0])  # type: ignore[union-attr]

    def weights(self, script: EditScript) -> None:
        initializers = {init.name: init for init in self.source.initializer}
        for record in script.weights:
            source = initializers.get(record.name)
            if source is None:  # a Constant node's value
                node = self.node(self.producer_of(record.name))
                stored = _constant_value(node)
            else:
                stored = source
            in_file = self.model.weights.get(record.name) if source is not None else None
            if in_file is not None:  # its raw_data is streamed from the file when written
                converted = onnx.TensorProto(data_type=dtypes.BY_NAME[record.dst].onnx)
                converted.dims.extend(source.dims)  # type: ignore[union-attr]
                key = record.name if record.in_place else record.stored_as
                self.streamed[key] = Converted(in_file, record.dst, record)
            else:
                converted = _converted(stored, record)
            if not record.in_place:
                converted.name = record.stored_as
                self.new_initializers.append(converted)
                self.types[record.stored_as] = dtypes.BY_NAME[record.dst].onnx
            elif source is None:  # a Constant node: one value attribute only
                converted.name = record.stored_as
                kept = [a for a in node.attribute if a.name not in CONSTANT_FLOAT_ATTRIBUTES]
                del node.attribute[:]
                node.attribute.extend(kept)
                _set_attribute(node, onnx.helper.make_attribute("value", converted))
                self.types[record.name] = dtypes.BY_NAME[record.dst].onnx
            else:
                converted.name = record.name
                self.initializers[record.name] = converted
                self.types[record.name] = dtypes.BY_NAME[record.dst].onnx

    def _declared_type(self, name: str) -> int:
        info = self.model.value_info.get(name)
        return info.type.tensor_type.elem_type if info is not None else 0

    def finish(self) -> onnx.ModelProto | StreamedModel:
        out = onnx.ModelProto()
        out.CopyFrom(self.model.proto)
        graph = out.graph
        order = []
        index = self.next[_HEAD]
        while index != _HEAD:
            order.append(index)
            index = self.next[index]
        del graph.node[:]
        graph.node.extend(self.nodes[index] for index in order)
        imported = {entry.domain for entry in out.opset_import}
        for domain in sorted(self.domains - imported):  # a fused op of onnxruntime's domain
            out.opset_import.append(onnx.helper.make_opsetid(domain, 1))
        self._write_initializers(graph)
        self._write_types(graph, order)
        if not (self.model.weights or self.model.external):
            return out
        data: dict[int, Data] = {}
        for position, init in enumerate(graph.initializer):
            found = self.streamed.get(init.name) or self.model.weights.get(init.name)
            if found is not None:
                data[position] = found
                if init.data_location == onnx.TensorProto.EXTERNAL:  # a plain data-less stub
                    init.ClearField("data_location")
                    del init.external_data[:]
        return StreamedModel(out, data, external=self.model.external)

    def _write_initializers(self, graph: onnx.GraphProto) -> None:
        if self.dropped:
            kept = [init for init in graph.initializer if init.name not in self.dropped]
            del graph.initializer[:]
            graph.initializer.extend(kept)
        if self.initializers:
            for position, init in enumerate(graph.initializer):
                if init.name in self.initializers:
                    graph.initializer[position].CopyFrom(self.initializers[init.name])
        graph.initializer.extend(self.new_initializers)

    def _write_types(self, graph: onnx.GraphProto, order: list[int]) -> None:
        types = self.types
        value_info = self.model.value_info
        for value in [*graph.input, *graph.output]:
            # a shape inference found where the model gave none, as onnx_ir writes it
            known = value_info.get(value.name)
            if (
                known is not None
                and known is not value
                and not value.type.tensor_type.HasField("shape")
            ):
                value.CopyFrom(known)
            if value.name in types:
                value.type.tensor_type.elem_type = types[value.name]
        outputs = {value.name for value in graph.output}
        inputs = {value.name for value in graph.input}
        made, graph_nodes, node_names = self.outputs, self.graph_nodes, self.model.node_names
        produced = [
            name
            for index in order
            for name in (
                made[index] if index in made else graph_nodes[node_names[index - 1]].outputs
            )
            if name and name not in outputs
        ]
        weights = [init.name for init in graph.initializer if init.name not in inputs]
        # The model's own entries first, in its order (a model onnx_ir wrote comes back as it
        # was), then every other typed value in node order.
        names: dict[str, None] = {}
        if self.source.value_info:
            wanted = set(produced) | set(weights)
            names.update(
                (info.name, None) for info in self.source.value_info if info.name in wanted
            )
        names.update(dict.fromkeys(produced))
        # Written as wire-format bytes that protobuf parses in one call: each entry is its
        # name and a TypeProto, serialised once per distinct type (a Cast's output has its
        # input's shape); building 50,000 messages field by field took a quarter second.
        type_bytes, shapes, varint = self.model.type_bytes, self.shapes, wire.varint
        fields: dict[tuple[bytes | None, int | None], bytes] = {}  # see _type_field
        chunks: list[bytes] = []
        for name in names:
            key = (type_bytes.get(shapes.get(name, name)), types.get(name))
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
