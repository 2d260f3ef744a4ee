"""Applying an edit script to a copy of a ``ModelProto`` (the model :mod:`reader` read).

Each graph of the model (the main graph, each If/Loop/Scan body, each model-local function's
copy at a call) is edited as a :class:`~graphamp.onnx.dialect.graph_edit.GraphEdit`: node order in a
linked list of node numbers; only the nodes an edit touches are copied, the rest are the
input's own messages, copied once into the output by protobuf. An inserted Cast goes right
after its producer (before everything, for a graph input or a weight), or first in the If
branch holding every reader (:mod:`graphamp.onnx.dialect.placement`); a model Cast that is
hoisted moves right after the producer of its input. Value types go into ``value_info`` for
every typed node output. A body is written back into its owner, innermost first; a
function's copy becomes a function of the model (:mod:`graphamp.onnx.dialect.functions`). A
weight the reader left in the model file or its external data (:mod:`graphamp.onnx.io.infile`)
stays there: the output holds it data-less, and the
:class:`~graphamp.onnx.io.infile.StreamedModel` returned reads (and rounds) it as it is written.
"""

from __future__ import annotations

import onnx

from graphamp.core import dtypes
from graphamp.core.graph import unique_name
from graphamp.dialects.base import ReadGraph
from graphamp.errors import InternalError
from graphamp.onnx.dialect import slots
from graphamp.onnx.dialect.graph_edit import (
    HEAD,
    GraphEdit,
    TypeOf,
    cast_to,
    constant_value,
    converted_tensor,
    read_renamed,
    rename_reads,
    set_attribute,
    write_io_types,
    write_value_info,
)
from graphamp.onnx.dialect.handles import Scope, Target
from graphamp.onnx.dialect.model_edit import ModelEdit
from graphamp.onnx.dialect.slots import CONSTANT_FLOAT_ATTRIBUTES, LOW_PRECISION_ATTRIBUTES
from graphamp.onnx.io.infile import Converted, Data, StreamedModel
from graphamp.plans.edits import EditScript
from graphamp.plans.records import RewriteRecord

# The ops (as the OpGraph names them) that may need an attribute to run low: a node of another
# op is not looked up in LOW_PRECISION_ATTRIBUTES.
_LOW_PRECISION_OPS = frozenset(
    slots.op_name(op, domain) for domain, op, _ in LOW_PRECISION_ATTRIBUTES
)


def apply(read: ReadGraph, script: EditScript) -> onnx.ModelProto | StreamedModel:
    """The converted model: a new proto; ``read.model``'s proto is not changed. A model read
    with its weights left in the file gives a :class:`~graphamp.onnx.io.infile.StreamedModel`:
    those weights are read, and converted, as it is written."""
    if script.new_nodes or script.new_inputs:
        raise InternalError("the ONNX dialect adds no training nodes")
    edit = _Edit(read.model, read.graph, read.handles)
    for rewrite in script.rewrites:
        edit.rewrite(rewrite)
    edit.weights(script)
    onnx_types = {d: dtypes.BY_NAME[d].onnx for d in set(script.retype.values())}
    edit.types.update({name: onnx_types[d] for name, d in script.retype.items()})
    readers: dict[str, list[Scope]] = {}
    if edit.nested:  # (what only a model with bodies or functions needs is imported for one)
        from graphamp.onnx.dialect.placement import reading_scopes

        readers = reading_scopes(script, edit.handles, edit.main.scope)
    for record in script.casts:
        edit.insert_cast(record.tensor, record.dst, record.output, readers.get(record.output))
    for record in script.output_casts:  # before rewiring: float32 readers read the Cast back
        node = script.cast_nodes.get(record.output, record.output)
        edit.output_cast(record.tensor, record.dst, record.output, node)
    boundaries = edit.handles.boundaries
    rewire = script.rewire.items()
    if not edit.nested:  # (a graph of one scope: once per rewired slot, thousands on the chain)
        main, number = edit.main, edit.number
        for (node_name, slot), tensor in rewire:
            main.node(number[node_name]).input[slot] = tensor
        rewire = {}.items()
    for (node_name, slot), tensor in rewire:
        if node_name in boundaries:
            edit.return_value(boundaries[node_name][slot], tensor)
        elif slot < 0:
            old = read.graph.nodes[node_name].implicit_inputs[-1 - slot]
            edit.rewire_inside(node_name, old, tensor)
        else:
            graph, index = edit.where(node_name)
            graph.node(index).input[slot] = edit.local(tensor)
    for node_name in script.hoist_casts:
        tensor = script.rewire.get((node_name, 0), read.graph.nodes[node_name].inputs[0])
        edit.hoist(node_name, tensor)
    graph_nodes = read.graph.nodes
    for node_name, low in script.low_nodes.items():
        if graph_nodes[node_name].op not in _LOW_PRECISION_OPS:  # (its proto's fields cost more)
            continue
        graph, index = edit.where(node_name)
        source = graph.nodes[index]
        needs = LOW_PRECISION_ATTRIBUTES.get((source.domain, source.op_type, low), {})
        for name, dtype in needs.items():
            attribute = onnx.helper.make_attribute(name, dtypes.BY_NAME[dtype].onnx)
            set_attribute(graph.node(index), attribute)
    for node_name, dtype in script.retarget_casts.items():
        graph, index = edit.where(node_name)
        attribute = onnx.helper.make_attribute("to", dtypes.BY_NAME[dtype].onnx)
        set_attribute(graph.node(index), attribute)
    for node_name in script.remove_nodes:
        graph, index = edit.where(node_name)
        graph.unlink(index)
    return edit.finish()


class _Edit(ModelEdit):
    """The edits, graph by graph, and the output they make."""

    # -- edits ----------------------------------------------------------------------------

    def insert_cast(
        self,
        tensor: str,
        dtype: str,
        output: str,
        readers: list[Scope] | None = None,
        node: str = "",
    ) -> None:
        """A Cast of ``tensor`` to ``dtype`` whose output is ``output`` (and so is its node's
        name, unless ``node`` gives another): right after the producer, or first in the body
        holding every reader (``readers``: the graphs that read it)."""
        cast = onnx.NodeProto()
        cast.CopyFrom(cast_to(dtype))  # (copying op_type and attribute costs less than setting)
        cast.name = node or output
        cast.output.append(output)
        if self.nested:
            graph, after = self.home(tensor)
            from graphamp.onnx.dialect.placement import place

            inside = place(graph.scope, readers) if readers else None
            if inside is not None:
                graph, after = self.graphs[id(inside)], HEAD
            cast.input.append(self.local(tensor))
        else:  # (the main graph, once per Cast: thousands on a large graph)
            graph, after = self.main, self.main_producer(tensor)
            cast.input.append(tensor)
        index = graph.add(cast, after)
        self.producer[output] = (graph, index)
        if graph is not self.main:
            self.placed[cast.name] = (graph, index)
        graph.outputs[index] = [output]
        self.types[output] = dtypes.BY_NAME[dtype].onnx
        self.shapes[output] = tensor

    def output_cast(self, low: str, dtype: str, output: str, cast_name: str) -> None:
        """Graph output ``output`` becomes ``low`` (every reader follows), read by a Cast
        (node ``cast_name``) back to ``dtype`` whose output is ``output``."""
        graph, producer = self.home(output)
        if producer == HEAD:  # the passes keep a graph input or weight that is an output
            raise InternalError(f"graph output {output!r} is no node's output: it cannot be cast")
        node = graph.node(producer)
        node.output[list(node.output).index(output)] = low
        graph.outputs[producer] = list(node.output)
        self.producer[low] = (graph, producer)
        for each in self.open_graphs():  # the readers read the value by its new name
            rename_reads(each, output, low, deep=self.nested)
        self.types[low] = self.types.get(output, self._declared_type(output))
        self.shapes[low] = output
        self.insert_cast(low, dtype, output, node=cast_name)

    def return_value(self, target: Target, tensor: str) -> None:
        """Boundary slot ``target`` reads ``tensor``: an input of the body's owner, or a
        result of the body, which returns a value of an enclosing scope through an Identity
        of its own (a body may only return what it produces or takes)."""
        scope, index, slot = target
        graph = self.graphs[id(scope)]
        if index >= 0:
            graph.node(index + 1).input[slot] = self.local(tensor)
            return
        if self.home(tensor)[0] is not graph:
            name = unique_name(f"{self.local(tensor)}__returned", self.taken_names())
            identity = onnx.helper.make_node("Identity", [self.local(tensor)], [name], name=name)
            index = graph.add(identity, graph.prev[HEAD])  # last
            self.producer[name] = (graph, index)
            graph.outputs[index] = [name]
            self.shapes[name] = tensor
            if tensor in self.types:
                self.types[name] = self.types[tensor]
            tensor = name
        graph.results[slot] = tensor

    def rewire_inside(self, node: str, old: str, new: str) -> None:
        """Make the subgraphs of ``node`` (a control-flow node kept whole) read ``new``
        wherever they read ``old``."""
        graph, index = self.where(node)
        read_renamed(graph.node(index), {self.local(old): self.local(new)}, inside_only=True)

    def hoist(self, node: str, tensor: str) -> None:
        """Move Cast ``node`` right after the producer of ``tensor``, its input, where that
        is in its graph (else first)."""
        graph, index = self.where(node)
        graph.unlink(index)
        home, producer = self.home(tensor)
        graph.link_after(producer if home is graph else HEAD, index)

    def rewrite(self, record: RewriteRecord) -> None:
        """The fused node in place of the last node it replaces, in that node's graph; the
        others unlinked; the initializers only they read dropped."""
        graph, last = self.where(record.replaces[-1])
        node = onnx.helper.make_node(
            record.op,
            [self.local(name) for name in record.inputs],
            [self.local(name) for name in record.outputs],
            name=record.node,
            domain=record.domain or None,
        )
        # as make_node adds keyword attributes (sorted), but with no name it could take for
        # one of its own parameters (doc_string, overload)
        node.attribute.extend(
            onnx.helper.make_attribute(key, value)
            for key, value in sorted(record.attributes.items())
        )
        index = graph.add(node, graph.prev[last])
        for name in record.replaces:
            owner, number = self.where(name)
            owner.unlink(number)
        if graph is self.main:
            self.number[record.node] = index
        else:
            self.placed[record.node] = (graph, index)
        for output in filter(None, record.outputs):
            self.producer[output] = (graph, index)
        graph.outputs[index] = list(node.output)
        for name in record.drops:
            body = self.handles.values.get(name)
            owner = self.graphs[id(body[0])] if body is not None else self.main
            owner.dropped.add(self.local(name))
        if record.domain:
            self.domains.add(record.domain)

    def weights(self, script: EditScript) -> None:
        for record in script.weights:
            body = self.handles.values.get(record.name)
            graph = self.graphs[id(body[0])] if body is not None else self.main
            local = self.local(record.name)
            source = self.initializers(graph).get(local)
            if source is None:  # a Constant node's value
                graph, producer = self.home(record.name)
                node = graph.node(producer)
                stored = constant_value(node)
            else:
                stored = source
            in_file = self.model.weights.get(record.name) if source is not None else None
            dst = dtypes.BY_NAME[record.dst].onnx
            if in_file is not None and graph is self.main:  # its raw_data is streamed
                converted = onnx.TensorProto(data_type=dst)
                converted.dims.extend(stored.dims)
                key = record.name if record.in_place else record.stored_as
                self.streamed[key] = Converted(in_file, record.dst, record)
            else:
                converted = converted_tensor(stored, record)
            if not record.in_place:
                converted.name = record.stored_as
                graph.new_initializers.append(converted)
                self.types[record.stored_as] = dst
            elif source is None:  # a Constant node: one value attribute only
                converted.name = local  # (the name it has in its own graph)
                kept = [a for a in node.attribute if a.name not in CONSTANT_FLOAT_ATTRIBUTES]
                del node.attribute[:]
                node.attribute.extend(kept)
                set_attribute(node, onnx.helper.make_attribute("value", converted))
                self.types[record.name] = dst
            else:
                converted.name = local
                graph.initializers[local] = converted
                self.types[record.name] = dst

    def _declared_type(self, name: str) -> int:
        info = self.model.value_info.get(name)
        return info.type.tensor_type.elem_type if info is not None else 0

    # -- the output -----------------------------------------------------------------------

    def finish(self) -> onnx.ModelProto | StreamedModel:
        type_of = TypeOf(self.model.type_bytes, self.types, self.shapes)
        written = None
        if self.handles.functions:
            from graphamp.onnx.dialect.function_writer import Writer

            written = Writer(self.model, self.handles, self.graphs)
        for scope in reversed(self.handles.scopes[1:]):  # innermost first
            edit = self.graphs[id(scope)]
            if scope.closed:  # a function's copy at a call
                assert written is not None  # closed scopes are made only for functions
                written.write(edit)
                continue
            body = self._finish_body(edit, type_of)
            owner = self.graphs[id(scope.parent)].node(scope.owner + 1)
            for attribute in owner.attribute:
                if attribute.name == scope.attribute:
                    if attribute.type == onnx.AttributeProto.GRAPH:
                        attribute.g.CopyFrom(body)
                    else:
                        attribute.graphs[scope.index].CopyFrom(body)
        out = onnx.ModelProto()
        out.CopyFrom(self.model.proto)
        graph = out.graph
        main = self.main
        order = main.order()
        main.write_nodes(graph, order)
        imported = {entry.domain for entry in out.opset_import}
        for domain in sorted(self.domains - imported):  # a fused op of onnxruntime's domain
            out.opset_import.append(onnx.helper.make_opsetid(domain, 1))
        main.write_initializers(graph)
        write_io_types(
            [*graph.input, *graph.output], self.model.value_info, self.types, self.model.type_bytes
        )
        made, graph_nodes, node_names = main.outputs, self.graph_nodes, self.model.node_names
        produced = [
            name
            for index in order
            for name in (
                made[index] if index in made else graph_nodes[node_names[index - 1]].outputs
            )
            if name
        ]
        write_value_info(graph, self.model.proto.graph, produced, type_of)
        if written is not None:
            written.finish(out)
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

    def _finish_body(self, graph: GraphEdit, type_of: TypeOf) -> onnx.GraphProto:
        """A body's graph as written: its nodes, initializers and value types."""
        scope = graph.scope
        out = onnx.GraphProto()
        out.CopyFrom(scope.graph)
        order = graph.order()
        graph.write_nodes(out, order)
        graph.write_initializers(out)
        values = scope.values or {}
        for value in [*out.input, *out.output]:  # each with its type now, as for node outputs
            found = type_of.type_proto(values.get(value.name, value.name))
            if found is not None:
                value.type.CopyFrom(found)
        for slot, tensor in graph.results.items():
            result = onnx.ValueInfoProto(name=self.local(tensor))
            found = type_of.type_proto(tensor)
            if found is not None:
                result.type.CopyFrom(found)
            out.output[slot].CopyFrom(result)
        made, nodes = graph.outputs, graph.nodes
        produced = [
            name
            for index in order
            for name in (made[index] if index in made else nodes[index].output)
            if name
        ]
        write_value_info(out, scope.graph, produced, type_of, values)
        return out
