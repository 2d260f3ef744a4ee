"""Model-local functions: each call site's body read into the OpGraph.

A call of a function of ``model.functions`` is a node that owns one body, the function at that
call site (``graphamp.core.graph.BodyKind.FUNCTION``, path ``<call>/<function>``): the reader reads
a copy of the function per call site (its attribute references resolved to the call's
attributes, its values typed by ONNX inference over the call's input types), so each call
path has its own decisions. Its parameters and results cross the boundary through boundary
nodes (``<call>/input:<name>``, ``<call>/output:<name>``), as a branch's results do. The
writer writes each copy back as a function of its own or inline
(:mod:`graphamp.onnx.dialect.function_writer`).

A call with more inputs or outputs than its function has, and functions that call each other
in a cycle, are refused in one line naming the call and the function.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import onnx

from graphamp.core import dtypes
from graphamp.core.graph import Body, BodyKind, NodeKind, OpNode
from graphamp.errors import GraphampError
from graphamp.onnx.dialect import slots
from graphamp.onnx.dialect.bodies import boundary
from graphamp.onnx.dialect.handles import CallSite, Reader, Scope
from graphamp.onnx.validation.validate_nodes import NodeFields, node_fields

if TYPE_CHECKING:
    pass


def enter(reader: Reader, scope: Scope, index: int, op_node: OpNode) -> bool:
    """Read the body of node ``index`` of ``scope`` if it calls a model-local function;
    False otherwise."""
    node = scope.graph.node[index]
    fields = scope.nodes[index]
    key = (fields.domain, fields.op_type, node.overload)
    function = reader.functions.get(key)
    if function is None:
        return False
    path, outer = op_node.name, op_node.body
    label = slots.op_name(function.name, function.domain)
    for what, given, taken in (
        ("inputs", len(fields.inputs), len(function.input)),
        ("outputs", len(fields.outputs), len(function.output)),
    ):
        if given > taken:
            raise GraphampError(
                f"node {path!r} calls function {label!r} with {given} {what}; it has {taken}"
            )
    if key in reader.calling:
        chain = " -> ".join(slots.op_name(name, domain) for domain, name, _ in reader.calling)
        raise GraphampError(
            f"node {path!r} calls function {label!r}, which is already being called "
            f"({chain} -> {label}): functions may not call each other in a cycle"
        )
    bound = {attribute.name: attribute for attribute in fields.attributes}
    attributes = {**defaults(function), **bound}
    body = Body(f"{path}/{function.name}", BodyKind.FUNCTION, owner=path, parent=outer)
    op_node.kind = NodeKind.CONTROL_FLOW
    op_node.inputs = []
    op_node.bodies = (body.path,)
    reader.add_node(op_node)
    copy = _copy(reader, scope, fields, function, attributes, body)
    for position, formal in enumerate(function.input):
        actual = fields.inputs[position] if position < len(fields.inputs) else ""
        parameter = reader.add_value(copy, formal)
        if not actual:
            continue
        boundary(
            None,
            f"{path}/input:{formal}",
            f"{label}.input",
            inputs=[reader.name(scope, actual)],
            outputs=[parameter],
            targets=[(scope, index, position)],
            body=outer,
            what=f"{label} input {formal!r}: one type at the call and in the body",
            types=[reader.type_of(scope, actual), reader.type_of(copy, formal)],
            reader=reader,
            producer=(scope, index),
        )
    reader.calling.append(key)
    around = reader.bound
    reader.bound = attributes
    reader.read_body(copy)
    reader.bound = around
    reader.calling.pop()
    body.inputs = [reader.name(copy, formal) for formal in function.input]
    body.outputs = [reader.name(copy, formal) for formal in function.output]
    for position, formal in enumerate(function.output):
        if position >= len(fields.outputs) or not fields.outputs[position]:
            continue
        local = fields.outputs[position]
        boundary(
            None,
            f"{path}/output:{formal}",
            f"{label}.output",
            inputs=[reader.name(copy, formal)],
            outputs=[reader.add_value(scope, local)],
            targets=[(copy, -1, position)],
            body=outer,
            what=f"{label} output {formal!r}: one type in the body and at the call",
            types=[reader.type_of(copy, formal), reader.type_of(scope, local)],
            reader=reader,
            producer=(scope, index),
        )
    reader.handles.calls.append(CallSite(scope, index, key, copy, attributes))
    return True


def defaults(function: onnx.FunctionProto) -> dict[str, onnx.AttributeProto]:
    """The function's attributes that have a default value."""
    return {attribute.name: attribute for attribute in function.attribute_proto}


def resolved(
    listed: Sequence[onnx.AttributeProto], bound: dict[str, onnx.AttributeProto] | None
) -> Sequence[onnx.AttributeProto]:
    """``listed`` with each reference to a function's attribute (``@alpha``) replaced by
    what the call gives it (``bound``); one the call leaves unset is left out (the op's
    default)."""
    if bound is None or not any(attribute.ref_attr_name for attribute in listed):
        return listed
    found = []
    for attribute in listed:
        if not attribute.ref_attr_name:
            found.append(attribute)
        elif attribute.ref_attr_name in bound:
            given = onnx.AttributeProto()
            given.CopyFrom(bound[attribute.ref_attr_name])
            given.name = attribute.name
            found.append(given)
    return found


def resolved_fields(
    nodes: list[NodeFields], bound: dict[str, onnx.AttributeProto] | None
) -> list[NodeFields]:
    """``nodes`` with their attribute references resolved (:func:`resolved`)."""
    if bound is None:
        return nodes
    return [fields._replace(attributes=resolved(fields.attributes, bound)) for fields in nodes]


def _copy(
    reader: Reader,
    scope: Scope,
    fields: NodeFields,
    function: onnx.FunctionProto,
    attributes: dict[str, onnx.AttributeProto],
    body: Body,
) -> Scope:
    """The scope of ``function``'s copy at this call: its nodes read with the call's
    attributes, its values typed by inference over the call's input types."""
    from graphamp.onnx.dialect.node_reader import node_names

    graph = onnx.GraphProto(name=function.name)
    graph.node.extend(function.node)
    graph.input.extend(onnx.ValueInfoProto(name=name) for name in function.input)
    graph.output.extend(onnx.ValueInfoProto(name=name) for name in function.output)
    nodes = resolved_fields(node_fields(graph), attributes)
    names, renamed = node_names(nodes)
    copy = Scope(body.path, graph, nodes, names, renamed, values={}, parent=scope, closed=True)
    copy.paths = [""] * len(nodes)
    copy.body = body
    copy.types = _types(reader, scope, fields, function, nodes)
    reader.handles.scopes.append(copy)
    return copy


def _types(
    reader: Reader,
    scope: Scope,
    fields: NodeFields,
    function: onnx.FunctionProto,
    nodes: list[NodeFields],
) -> dict[str, bytes]:
    """The types of a call's copy of ``function``: what the function declares (its
    ``value_info``), else the element type ONNX inference gives over the call's input types (a
    function is typed by its call site: its own protos carry no types); none where a call
    input's type is unknown or inference gives up (the local fallback types what it can)."""
    types = {info.name: info.type.SerializeToString() for info in function.value_info}
    tensors = reader.op_graph.tensors
    inputs = []
    for formal, actual in zip(function.input, fields.inputs, strict=False):
        tensor = tensors.get(reader.name(scope, actual)) if actual else None
        if tensor is None or tensor.dtype not in dtypes.BY_NAME:
            return types  # a sequence, or a type nobody knows
        shape = (
            None if tensor.shape is None else [d if d is not None else "?" for d in tensor.shape]
        )
        elem = dtypes.BY_NAME[tensor.dtype].onnx
        inputs.append(onnx.helper.make_tensor_value_info(formal, elem, shape))
    graph = onnx.helper.make_graph([], "call", inputs, [])
    for each in nodes:
        node = graph.node.add()
        node.op_type, node.domain, node.name = each.op_type, each.domain, each.name
        node.input.extend(each.inputs)
        node.output.extend(each.outputs)
        node.attribute.extend(each.attributes)
    graph.output.extend(onnx.helper.make_empty_tensor_value_info(o) for o in function.output)
    model = onnx.helper.make_model(
        graph,
        opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in reader.opsets.items()],
        functions=list(reader.functions.values()),
    )
    model.ir_version = max(reader.model.proto.ir_version, 8)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # inference gives up on some ops: the local fallback types what it can
        return types
    infos = {i.name: i for i in (*inferred.graph.value_info, *inferred.graph.output)}
    for name in (*function.input, *(out for each in nodes for out in each.outputs)):
        info = infos.get(name) if name not in types else None
        if info is not None and info.type.HasField("tensor_type"):
            elem = info.type.tensor_type.elem_type
            if elem:
                types[name] = onnx.TypeProto(
                    tensor_type=onnx.TypeProto.Tensor(elem_type=elem)
                ).SerializeToString()
    return types
