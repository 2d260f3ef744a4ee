"""Applying an edit script to an onnx_ir model.

Inserted Casts go right after their producer (or first, for graph inputs and initializers), so
the node order stays topological without a re-sort; a Cast of a value that only a body reads
goes first in the deepest body that holds every reader, never into a loop body the value does
not change (:mod:`graphamp.onnx.placement`). Edits inside If, Loop and Scan bodies are made
there: a boundary node's slot is an input of the body's owner or an output of the body.
Weights are converted, never cast at run time, and a conversion that would overflow is
refused: classify keeps such readers float32. A converted weight is a
:class:`~graphamp.onnx.ir_tensors.ConvertedTensor`: nothing is read or rounded until the model is
saved (a chunk at a time) or turned into a proto.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphamp.dialects.base import ReadGraph
from graphamp.errors import InternalError
from graphamp.onnx import functions, placement
from graphamp.onnx.handles import OnnxHandles
from graphamp.onnx.ir_tensors import ConvertedTensor
from graphamp.onnx.reader import subgraph_nodes
from graphamp.onnx.slots import CONSTANT_FLOAT_ATTRIBUTES, LOW_PRECISION_ATTRIBUTES
from graphamp.onnx.types import ir_type
from graphamp.plans.edits import EditScript
from graphamp.plans.records import RewriteRecord


def apply(read: ReadGraph, script: EditScript) -> ir.Model:
    """Apply ``script`` to ``read.model`` (modified in place and returned)."""
    model: ir.Model = read.model
    graph = model.graph
    handles: OnnxHandles = read.handles
    values, nodes, op_graph = handles.values, handles.nodes, read.graph

    for rewrite in script.rewrites:
        _rewrite(graph, values, nodes, rewrite)

    for record in script.weights:
        source = values[record.name]
        # Converted when its bytes are needed; an overflow then raises InternalError: classify
        # keeps the readers of such weights float32, and clamping silently is the one thing
        # graphamp must never do.
        # (converted in place, it keeps the name it has in its own graph or function)
        name = source.name if record.in_place and source.name else record.stored_as
        tensor = ConvertedTensor(_stored(source), record.dst, name, record)
        if not record.in_place:
            copy = ir.Value(
                name=record.stored_as,
                shape=source.shape,
                type=ir.TensorType(ir_type(record.dst)),
                const_value=tensor,
            )
            placement.graph_of(source, graph).register_initializer(copy)
            values[record.stored_as] = copy
        elif source.producer() is not None:  # a Constant node: one value attribute only
            attributes = source.producer().attributes  # type: ignore[union-attr]
            for key in CONSTANT_FLOAT_ATTRIBUTES:
                attributes.pop(key, None)
            attributes["value"] = ir.AttrTensor("value", tensor)
            source.dtype = ir_type(record.dst)
        else:
            source.const_value = tensor
            source.dtype = ir_type(record.dst)

    for name, dtype in script.retype.items():
        values[name].dtype = ir_type(dtype)

    readers = placement.reading_graphs(script, handles)
    for record in script.casts:
        source = values[record.tensor]
        where = placement.place(source, readers.get(record.output, []), handles, graph)
        _insert_cast(where, values, record.tensor, record.dst, record.output)

    # Output casts before rewiring: a float32 reader of a kept output reads its Cast back.
    for record in script.output_casts:
        low_value = values[record.output]
        low_value.name = record.tensor
        values[record.tensor] = low_value
        where = (graph, low_value.producer())
        node_name = script.cast_nodes.get(record.output, record.output)
        cast_out = _insert_cast(where, values, record.tensor, record.dst, record.output, node_name)
        for index, output in enumerate(graph.outputs):
            if output is low_value:
                graph.outputs[index] = cast_out
    returns = placement.Returns(model)
    for (node_name, slot), tensor in script.rewire.items():
        if node_name in handles.boundaries:
            returns.rewire(handles.boundaries[node_name][slot], values[tensor])
            continue
        node = nodes[node_name]
        if slot >= 0:
            node.replace_input_with(slot, values[tensor])
        else:
            old = values[op_graph.nodes[node_name].implicit_inputs[-1 - slot]]
            _rewire_inside(node, old, values[tensor])

    for node_name in script.hoist_casts:  # right after the producer of its (rewired) input
        node = nodes[node_name]
        home: ir.Graph = node.graph  # type: ignore[assignment]
        home.remove(node)
        producer = node.inputs[0].producer() if node.inputs[0] is not None else None
        if producer is not None and producer.graph is home:
            home.insert_after(producer, node)
        else:
            placement.insert_first(home, node)

    for node_name, low in script.low_nodes.items():
        if node_name in handles.boundaries:
            continue  # a boundary node is no node of the model
        node = nodes[node_name]
        needs = LOW_PRECISION_ATTRIBUTES.get((node.domain, node.op_type, low), {})
        for name, dtype in needs.items():
            node.attributes[name] = ir.AttrInt64(name, ir_type(dtype))

    for node_name, dtype in script.retarget_casts.items():
        nodes[node_name].attributes["to"] = ir.AttrInt64("to", ir_type(dtype))

    for name in script.remove_nodes:
        nodes[name].graph.remove(nodes[name], safe=True)  # type: ignore[union-attr]

    if script.new_nodes or script.new_inputs:
        raise InternalError("the ONNX dialect adds no training nodes")
    functions.write_back(model, handles)
    return model


def _stored(value: ir.Value) -> ir.TensorProtocol:
    """The stored tensor behind ``value``: an initializer's, or its Constant node's."""
    if value.const_value is not None:
        return value.const_value
    producer = value.producer()
    attr = producer.attributes.get("value") if producer is not None else None
    if attr is not None and attr.type is ir.AttributeType.TENSOR:
        return attr.value
    for key in ("value_float", "value_floats"):
        if producer is not None and key in producer.attributes:
            return ir.tensor(np.array(producer.attributes[key].value, np.float32))
    raise InternalError(f"weight {value.name!r} has no stored value")


def _insert_cast(
    where: placement.Place,
    values: dict[str, ir.Value],
    tensor: str,
    dtype: str,
    output: str,
    node_name: str = "",
) -> ir.Value:
    """A Cast of ``tensor`` to ``dtype`` whose output is ``output`` (and so is its node's name,
    unless ``node_name`` gives another), in ``where``'s graph: right after ``where``'s node,
    or first."""
    source = values[tensor]
    out = ir.Value(name=output, shape=source.shape, type=ir.TensorType(ir_type(dtype)))
    attributes = [ir.AttrInt64("to", ir_type(dtype))]
    cast = ir.Node("", "Cast", [source], attributes, outputs=[out], name=node_name or output)
    graph, after = where
    if after is not None:
        graph.insert_after(after, cast)
    else:
        placement.insert_first(graph, cast)
    values[output] = out
    return out


def _rewire_inside(node: ir.Node, old: ir.Value, new: ir.Value) -> None:
    """Make the subgraphs of ``node`` read ``new`` wherever they read ``old``."""
    inner = {id(n) for n in subgraph_nodes(node)}
    for use in list(old.uses()):
        if id(use.node) in inner:
            use.node.replace_input_with(use.idx, new)


def _rewrite(
    graph: ir.Graph, values: dict[str, ir.Value], nodes: dict[str, ir.Node], record: RewriteRecord
) -> None:
    """The fused node in place of the last node it replaces, in that node's graph (the main
    graph or an If/Loop/Scan body), writing the same values under their own names; the
    replaced nodes removed."""
    replaced = [nodes[name] for name in record.replaces]
    owner = replaced[-1].graph
    if not isinstance(owner, ir.Graph):
        raise InternalError(f"rewrite {record.node!r}: {record.replaces[-1]!r} is in no graph")
    outputs: list[tuple[str, ir.Value, ir.Value]] = []
    written = []
    for name in record.outputs:
        new = ir.Value(name="")  # an output left out
        if name:
            old = values[name]
            new = ir.Value(name=old.name, shape=old.shape, type=old.type)
            outputs.append((name, old, new))
        written.append(new)
    attributes = [
        ir.AttrInt64(key, value) if isinstance(value, int) else ir.AttrFloat32(key, value)
        for key, value in record.attributes.items()
    ]
    fused = ir.Node(
        record.domain,
        record.op,
        [values[name] for name in record.inputs],
        attributes,
        outputs=written,
        name=record.node,
    )
    owner.insert_before(replaced[-1], fused)
    if record.domain and record.domain not in graph.opset_imports:
        graph.opset_imports[record.domain] = 1  # a fused op of onnxruntime's domain
    for name, old, new in outputs:
        old.replace_all_uses_with(new)
        for index, output in enumerate(owner.outputs):
            if output is old:
                owner.outputs[index] = new
        values[name] = new
    owner.remove(replaced, safe=True)
    nodes[record.node] = fused
    for name in record.drops:
        dropped = values.get(name)  # an initializer of the graph it sits in
        home = dropped.graph if dropped is not None else None
        if dropped is not None and dropped.name and isinstance(home, ir.Graph):
            home.initializers.pop(dropped.name, None)
