"""Model-local functions: each call site's body read into the OpGraph and written back as a
function copy specialised to what the conversion decided there.

A call of a function of ``model.functions`` is a node that owns one body, the function at that
call site (``graphamp.core.graph.BodyKind.FUNCTION``, path ``<call>/<function>``): the reader reads
a copy of the function per call site (its attribute references resolved to the call's
attributes, its values typed by ONNX inference over the call's input types), so each call
path has its own decisions. Its parameters and results cross the boundary through boundary
nodes (``<call>/input:<name>``, ``<call>/output:<name>``), as a branch's results do.

After the edits, :func:`write_back` turns every call site's copy into a FunctionProto: a copy
that came out as the function was stays a call of the function; the others are grouped by
content, and each distinct one is added to the model once, named ``<function>__<digest>`` (the
first 8 hex digits of its content's SHA-256: the same decisions give the same name, run after
run), and called instead. A function no call reads any more is removed. Innermost call sites
go first, so a copy that calls another function calls that call site's own copy.

A call with more inputs or outputs than its function has, and functions that call each other
in a cycle, are refused in one line naming the call and the function.
"""

from __future__ import annotations

import hashlib

import onnx
import onnx_ir as ir

from graphamp.core import dtypes
from graphamp.core.graph import Body, BodyKind, NodeKind, OpNode
from graphamp.errors import GraphampError
from graphamp.onnx import bodies, slots
from graphamp.onnx.handles import CallSite, FunctionId, OnnxHandles, Reader

INLINE_KEY = "graphamp.inline_functions"  # model.meta: write call sites' bodies inline


def enter(reader: Reader, node: ir.Node, op_node: OpNode) -> bool:
    """Read the body of ``node`` if it calls a model-local function; False otherwise."""
    key = (node.domain, node.op_type, node.overload)
    function = reader.model.functions.get(key)
    if function is None:
        return False
    path, outer = op_node.name, op_node.body
    label = slots.op_name(function.name, function.domain)
    for what, given, taken in (
        ("inputs", len(node.inputs), len(function.inputs)),
        ("outputs", len(node.outputs), len(function.outputs)),
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
    copy = function.clone()
    bound = reader.attributes(node)
    body = Body(f"{path}/{function.name}", BodyKind.FUNCTION, owner=path, parent=outer)
    op_node.kind = NodeKind.CONTROL_FLOW
    op_node.inputs = []
    op_node.bodies = (body.path,)
    reader.op_graph.add_node(op_node)
    _type_copy(reader, node, copy, function, bound)
    for index, formal in enumerate(copy.inputs):
        actual = node.inputs[index] if index < len(node.inputs) else None
        parameter = reader.add_value(formal, body.path)
        if actual is None:
            continue
        bodies.boundary(
            reader,
            f"{path}/input:{formal.name}",
            f"{label}.input",
            inputs=[reader.name(actual)],
            outputs=[parameter],
            targets=[(node, index)],
            body=outer,
            what=f"{label} input {formal.name!r}: one type at the call and in the body",
            values=[actual, formal],
        )
    reader.calling.append(key)
    scope = reader.bound
    reader.bound = attributes = {**_defaults(function), **bound}
    reader.read_body(copy.graph, body, node.graph)  # type: ignore[arg-type]
    reader.bound = scope
    reader.calling.pop()
    body.inputs = [reader.name(v) for v in copy.inputs]
    body.outputs = [reader.name(v) for v in copy.outputs]
    for index, formal in enumerate(copy.outputs):
        if index >= len(node.outputs) or not node.outputs[index].name:
            continue
        value = node.outputs[index]
        bodies.boundary(
            reader,
            f"{path}/output:{formal.name}",
            f"{label}.output",
            inputs=[reader.name(formal)],
            outputs=[reader.add_value(value, outer)],
            targets=[(copy.graph, index)],
            body=outer,
            what=f"{label} output {formal.name!r}: one type in the body and at the call",
            values=[formal, value],
        )
    reader.handles.calls.append(CallSite(node, key, copy, attributes))
    return True


def resolve(attributes: dict[str, ir.Attr], bound: dict[str, ir.Attr] | None) -> dict[str, ir.Attr]:
    """``attributes`` with each reference to a function's attribute (``@alpha``) replaced by
    what the call gives it (``bound``); one the call leaves unset is left out (the op's
    default)."""
    if bound is None or not any(a.is_ref() for a in attributes.values()):
        return attributes
    resolved = {}
    for name, attribute in attributes.items():
        if not attribute.is_ref():
            resolved[name] = attribute
        elif attribute.ref_attr_name in bound:
            given = bound[attribute.ref_attr_name]
            resolved[name] = ir.Attr(name, given.type, given.value)
    return resolved


def _defaults(function: ir.Function) -> dict[str, ir.Attr]:
    return {name: a for name, a in function.attributes.items() if a.value is not None}


def _type_copy(
    reader: Reader,
    node: ir.Node,
    copy: ir.Function,
    function: ir.Function,
    bound: dict[str, ir.Attr],
) -> None:
    """Type the values of ``copy`` by ONNX inference over the call's input types (a function
    is typed by its call site: its own protos carry no types)."""
    tensors = reader.op_graph.tensors
    inputs = []
    for formal, actual in zip(copy.inputs, node.inputs, strict=False):
        tensor = tensors.get(reader.name(actual)) if actual is not None else None
        if tensor is None or tensor.dtype not in dtypes.BY_NAME:
            return  # a sequence, or a type nobody knows: the local fallback types what it can
        shape = (
            None if tensor.shape is None else [d if d is not None else "?" for d in tensor.shape]
        )
        elem = dtypes.BY_NAME[tensor.dtype].onnx
        inputs.append(onnx.helper.make_tensor_value_info(formal.name, elem, shape))
    proto = ir.serde.serialize_function(copy)
    nodes = []
    attributes = {**_defaults(function), **bound}
    for each in proto.node:
        inner = onnx.NodeProto()
        inner.CopyFrom(each)
        _resolve_proto(inner, attributes)
        nodes.append(inner)
    graph = onnx.helper.make_graph(nodes, "call", inputs, [])
    graph.output.extend(onnx.helper.make_empty_tensor_value_info(o) for o in proto.output)
    model = onnx.helper.make_model(
        graph,
        opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in reader.opsets.items()],
        functions=[ir.serde.serialize_function(f) for f in reader.model.functions.values()],
    )
    model.ir_version = max(reader.model.ir_version, 8)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # inference gives up on some ops: the local fallback types what it can
        return
    infos = {i.name: i for i in (*inferred.graph.value_info, *inferred.graph.output)}
    for value in (*copy.inputs, *(v for n in copy for v in n.outputs)):
        info = infos.get(value.name) if value.type is None else None
        if info is not None and info.type.HasField("tensor_type"):
            elem = info.type.tensor_type.elem_type
            if elem:
                value.dtype = ir.DataType(elem)


def _resolve_proto(node: onnx.NodeProto, attributes: dict[str, ir.Attr]) -> None:
    kept = []
    for attribute in node.attribute:
        if not attribute.ref_attr_name:
            kept.append(attribute)
        elif attribute.ref_attr_name in attributes:
            given = ir.serde.serialize_attribute(attributes[attribute.ref_attr_name])
            given.name = attribute.name
            kept.append(given)
    del node.attribute[:]
    node.attribute.extend(kept)


def write_back(model: ir.Model, handles: OnnxHandles) -> None:
    """Each call site's copy as the function it calls (module docstring), or inlined in its
    place where the model's meta asks for it (``--inline-functions``)."""
    calls = handles.calls
    if not calls:
        return
    if model.meta.get(INLINE_KEY):
        inline(model, calls, handles)
        return
    originals = {key: _content(f) for key, f in model.functions.items()}
    called_before = {call.function for call in calls}
    added: dict[bytes, FunctionId] = {}
    for call in calls:  # read innermost first: an outer copy then names the inner copies
        content = _content(call.copy)
        if content == originals[call.function]:
            continue
        key = added.get(content)
        if key is None:
            domain, name, overload = call.function
            digest = hashlib.sha256(content).hexdigest()[:8]
            key = (domain, f"{name}__{digest}", overload)
            proto = _proto(call.copy)
            proto.name = key[1]
            model.functions[key] = ir.serde.deserialize_function(proto)
            added[content] = key
        call.node.op_type = key[1]
    for key in called_before - _called(model):
        del model.functions[key]


def _proto(function: ir.Function) -> onnx.FunctionProto:
    """The function as written: no value types (a function takes its types from its call
    site), whatever the conversion learned at one."""
    proto = ir.serde.serialize_function(function)
    del proto.value_info[:]
    kept = [p for p in proto.metadata_props if not p.key.startswith("pkg.onnx_ir")]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    return proto


def _content(function: ir.Function) -> bytes:
    proto = _proto(function)
    return proto.SerializeToString(deterministic=True)


def _called(model: ir.Model) -> set[FunctionId]:
    """The functions a call reaches from the main graph, through the functions it calls."""
    found: set[FunctionId] = set()
    pending: list[ir.Graph | ir.Function] = [model.graph]
    while pending:
        for node in ir.traversal.RecursiveGraphIterator(pending.pop()):  # type: ignore[arg-type]
            key = (node.domain, node.op_type, node.overload)
            if key in model.functions and key not in found:
                found.add(key)
                pending.append(model.functions[key])
    return found


def inline(model: ir.Model, calls: list[CallSite], handles: OnnxHandles) -> None:
    """Each call replaced by its copy's nodes, innermost first; the nodes and values take
    their names in the OpGraph (``<call>/<function>/<name>``), so a plan of the inlined model
    names them as this conversion's plan does."""
    named = {id(value): name for name, value in handles.values.items()}
    paths = {id(node): path for path, node in handles.nodes.items()}
    for call in calls:
        node, copy = call.node, call.copy
        graph: ir.Graph = node.graph  # type: ignore[assignment]
        for formal, actual in zip(copy.inputs, node.inputs, strict=False):
            if actual is not None:
                formal.replace_all_uses_with(actual)
        results = list(copy.outputs)
        copy.outputs.clear()  # a value is the output of one graph at most
        moved = list(copy)
        for inner in moved:
            copy.remove(inner)
            inner.name = paths.get(id(inner), inner.name)
            for key, attribute in resolve(dict(inner.attributes), call.attributes).items():
                inner.attributes[key] = attribute
            for key in [k for k, a in inner.attributes.items() if a.is_ref()]:
                del inner.attributes[key]  # left unset by the call: the op's default
            for value in inner.outputs:
                value.name = named.get(id(value), value.name)
                if value.shape is None:  # a type with no shape: left to inference (checker)
                    value.type = None
            graph.insert_before(node, inner)
        for index, result in enumerate(node.outputs):
            formal = results[index]
            if formal.producer() is None or formal.producer() not in moved:  # passed through
                identity = ir.Node("", "Identity", [formal], name=f"{paths[id(node)]}/{index}")
                graph.insert_before(node, identity)
                formal = identity.outputs[0]
            name = result.name
            result.name = f"{name}__inlined"  # free the name for the body's own value
            formal.name = name
            formal.type, formal.shape = result.type, result.shape  # what the call gave it
            result.replace_all_uses_with(formal, replace_graph_outputs=True)
        graph.remove(node, safe=True)
    for key in {call.function for call in calls} - _called(model):
        del model.functions[key]
    # the inlined values typed as ONNX inference types them when the model is read again
    from onnx_ir.passes.common import ShapeInferencePass

    ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(model)
