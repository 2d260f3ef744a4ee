"""The bodies of If, Loop and Scan nodes, read into the OpGraph where their owner is.

A body is a scope of the one graph (``graphamp.core.graph.Body``; docs/ARCHITECTURE.md, "Bodies are
scopes of the same graph"): its nodes and values are named ``<owner>/<attribute>/<name>`` and
decided by the same passes as the main graph's. The owner stays in the graph as a
``CONTROL_FLOW`` node that computes nothing and reads only the inputs no body parameter takes
(an If's condition, a Loop's trip count and condition). Each value that crosses the boundary
is a ``BOUNDARY`` node whose slots take one type:

* If: one per output, reading both branches' results (``<if>/output:<name>``);
* Loop: one per loop-carried value, reading its initial value and, as a back input, the
  body's next value, producing the body's parameter and the final value
  (``<loop>/carried:<parameter>``); one per scan output (``<loop>/scan_output:<name>``);
* Scan: the same for its state variables and scan outputs, and one per scanned input
  (``<scan>/scan_input:<parameter>``); before opset 9 its first input, the sequence lengths,
  stays the owner's;
* SequenceMap: one per input (``<map>/input:<parameter>``) and output
  (``<map>/output:<name>``); a sequence cannot be cast, so one over a sequence keeps the
  sequence's type and the body casts what it needs itself.

The ONNX writer maps a boundary's input slots back to where the model reads them (an input of
the owner, or an output of a body graph: ``OnnxHandles.boundaries``). A node of another kind
with a body (a contrib op's beam search, FlexAttention's score functions) is kept whole.
"""

from __future__ import annotations

import onnx_ir as ir

from graphamp.core.dtypes import FLOAT_TYPES, UNKNOWN
from graphamp.core.graph import Body, BodyKind, NodeKind, OpNode, unique_name
from graphamp.errors import GraphampError
from graphamp.onnx import schemas, slots
from graphamp.onnx.handles import Reader
from graphamp.onnx.types import ir_type

Target = tuple[ir.Node | ir.Graph, int]  # where a boundary's input slot is read in the model


def enter(reader: Reader, node: ir.Node, op_node: OpNode) -> bool:
    """Read ``node``'s bodies into the graph if it is an If, Loop or Scan, with
    ``op_node`` (its name, inputs and body already set) as their owner; False for any other
    node, which the reader reads as usual."""
    if node.domain not in slots.DEFAULT_DOMAINS:
        return False
    if node.op_type == "If":
        _enter_if(reader, node, op_node)
    elif node.op_type == "Loop":
        _enter_loop(reader, node, op_node)
    elif node.op_type == "Scan":
        _enter_scan(reader, node, op_node)
    elif node.op_type == "SequenceMap":
        _enter_sequence_map(reader, node, op_node)
    else:
        return False
    return True


def _owner(reader: Reader, op_node: OpNode, inputs: list[str], bodies: list[str]) -> None:
    op_node.kind = NodeKind.CONTROL_FLOW
    op_node.inputs = inputs
    op_node.bodies = tuple(bodies)
    reader.op_graph.add_node(op_node)


def _graph(node: ir.Node, attribute: str) -> ir.Graph:
    found = node.attributes.get(attribute)
    if found is None or found.type is not ir.AttributeType.GRAPH:
        raise GraphampError(f"node {node.name!r} ({node.op_type}) has no {attribute} graph")
    return found.value


def _arity(node: ir.Node, path: str, what: str, expected: int, found: int) -> None:
    """Refuse a body whose parameters or results do not match its owner's inputs or
    outputs (``what``: "<body> takes" or "<body> returns")."""
    if expected != found:
        raise GraphampError(
            f"node {path!r} ({node.op_type}): {what} {found} values where the {node.op_type}"
            f" needs {expected}"
        )


def _enter_if(reader: Reader, node: ir.Node, op_node: OpNode) -> None:
    path, outer = op_node.name, op_node.body
    branches = [(name, _graph(node, name)) for name in ("then_branch", "else_branch")]
    _owner(reader, op_node, [reader.name(node.inputs[0])], [f"{path}/{a}" for a, _ in branches])
    for attribute, graph in branches:
        _arity(node, path, f"{attribute} returns", len(node.outputs), len(graph.outputs))
        body = Body(f"{path}/{attribute}", BodyKind.BRANCH, owner=path, parent=outer)
        reader.read_body(graph, body, node.graph)  # type: ignore[arg-type]
        body.outputs = [reader.name(v) for v in graph.outputs]
    for index, value in enumerate(node.outputs):
        results = [graph.outputs[index] for _, graph in branches]
        boundary(
            reader,
            f"{path}/output:{value.name}",
            "If.output",
            inputs=[reader.name(v) for v in results],
            outputs=[reader.add_value(value, outer)],
            targets=[(graph, index) for _, graph in branches],
            body=outer,
            what=f"If output {value.name!r}: one type in both branches and after the If",
            values=[*results, value],
        )


def _enter_loop(reader: Reader, node: ir.Node, op_node: OpNode) -> None:
    path, outer = op_node.name, op_node.body
    graph = _graph(node, "body")
    initial = list(node.inputs[2:])
    count = len(initial)
    _arity(node, path, "its body takes", count + 2, len(graph.inputs))
    _arity(node, path, "its body returns", len(node.outputs) + 1, len(graph.outputs))
    body = Body(f"{path}/body", BodyKind.LOOP, owner=path, parent=outer)
    inputs = [reader.name(v) for v in node.inputs[:2]] + [""] * (2 - len(node.inputs[:2]))
    _owner(reader, op_node, inputs, [body.path])
    for value in graph.inputs[:2]:  # the iteration number and the condition
        reader.add_value(value, body.path)
    carried = _carried(reader, node, graph, initial, body, first_input=2, first_param=2)
    reader.read_body(graph, body, node.graph)  # type: ignore[arg-type]
    _close(reader, node, graph, body, carried, first_result=1)


def _enter_scan(reader: Reader, node: ir.Node, op_node: OpNode) -> None:
    path, outer = op_node.name, op_node.body
    graph = _graph(node, "body")
    lengths = 1 if slots.opset_of(reader.opsets, "") < 9 else 0  # Scan 8's sequence_lens
    scanned = int(node.attributes["num_scan_inputs"].value)
    count = len(node.inputs) - lengths - scanned
    _arity(node, path, "its body takes", len(node.inputs) - lengths, len(graph.inputs))
    _arity(node, path, "its body returns", len(node.outputs), len(graph.outputs))
    body = Body(f"{path}/body", BodyKind.LOOP, owner=path, parent=outer)
    _owner(reader, op_node, [reader.name(v) for v in node.inputs[:lengths]], [body.path])
    initial = list(node.inputs[lengths : lengths + count])
    carried = _carried(reader, node, graph, initial, body, first_input=lengths, first_param=0)
    for index in range(count, len(graph.inputs)):
        parameter = graph.inputs[index]
        source = node.inputs[lengths + index]
        boundary(
            reader,
            f"{path}/scan_input:{parameter.name}",
            "Scan.scan_input",
            inputs=[reader.name(source)],
            outputs=[reader.add_value(parameter, body.path)],
            targets=[(node, lengths + index)],
            body=outer,
            what=f"Scan input {parameter.name!r}: one type outside and in the body",
            values=[source, parameter],
        )
    reader.read_body(graph, body, node.graph)  # type: ignore[arg-type]
    _close(reader, node, graph, body, carried, first_result=0)


def _enter_sequence_map(reader: Reader, node: ir.Node, op_node: OpNode) -> None:
    path, outer = op_node.name, op_node.body
    graph = _graph(node, "body")
    _arity(node, path, "its body takes", len(node.inputs), len(graph.inputs))
    _arity(node, path, "its body returns", len(node.outputs), len(graph.outputs))
    body = Body(f"{path}/body", BodyKind.LOOP, owner=path, parent=outer)
    _owner(reader, op_node, [], [body.path])
    for index, (source, parameter) in enumerate(zip(node.inputs, graph.inputs, strict=True)):
        boundary(
            reader,
            f"{path}/input:{parameter.name}",
            "SequenceMap.input",
            inputs=[reader.name(source)],
            outputs=[reader.add_value(parameter, body.path)],
            targets=[(node, index)],
            body=outer,
            what=f"SequenceMap input {parameter.name!r}: one type outside and in the body",
            values=[source, parameter],
            # the first input is a sequence; another is one unless its type says otherwise
            sequence=index == 0 or source is None or not isinstance(source.type, ir.TensorType),
        )
    reader.read_body(graph, body, node.graph)  # type: ignore[arg-type]
    body.inputs = [reader.name(v) for v in graph.inputs]
    body.outputs = [reader.name(v) for v in graph.outputs]
    for index, (result, value) in enumerate(zip(graph.outputs, node.outputs, strict=True)):
        boundary(
            reader,
            f"{path}/output:{value.name}",
            "SequenceMap.output",
            inputs=[reader.name(result)],
            outputs=[reader.add_value(value, outer)],
            targets=[(graph, index)],
            body=outer,
            what=f"SequenceMap output {value.name!r}: one type in the body and after",
            values=[result, value],
            sequence=True,
        )


def _carried(
    reader: Reader,
    node: ir.Node,
    graph: ir.Graph,
    initial: list[ir.Value | None],
    body: Body,
    *,
    first_input: int,
    first_param: int,
) -> list[OpNode]:
    """A boundary node per loop-carried value (Loop) or state variable (Scan), before the
    body is read: it produces the body's parameter. Its back input, the body's next value, is
    filled in by :func:`_close`. ``first_input``/``first_param``: the first carried input of
    the node and parameter of the body (a Loop's come after its trip count and condition)."""
    first_result = first_param // 2  # a Loop's body returns its condition first
    carried = []
    for index, source in enumerate(initial):
        parameter = graph.inputs[first_param + index]
        final = node.outputs[index]
        outputs = [reader.add_value(parameter, body.path), reader.add_value(final, body.parent)]
        carried.append(
            boundary(
                reader,
                f"{body.owner}/carried:{parameter.name}",
                f"{node.op_type}.carried",
                inputs=[reader.name(source), ""],
                outputs=outputs,
                targets=[(node, first_input + index), (graph, first_result + index)],
                body=body.parent,
                what=f"{node.op_type} carried value {parameter.name!r}: one type at entry, in"
                " the body and at exit",
                values=[source, parameter, final, graph.outputs[first_result + index]],
                back=True,
            )
        )
    return carried


def _close(
    reader: Reader,
    node: ir.Node,
    graph: ir.Graph,
    body: Body,
    carried: list[OpNode],
    *,
    first_result: int,
) -> None:
    """After the body is read: the carried values' back inputs, and a boundary node per scan
    output."""
    body.inputs = [reader.name(v) for v in graph.inputs]
    body.outputs = [reader.name(v) for v in graph.outputs]
    for index, value in enumerate(carried):
        value.inputs[1] = body.outputs[first_result + index]
        _agree(reader, node, value)
        _final_shape(reader, value)
    for index in range(len(carried), len(node.outputs)):
        value = node.outputs[index]
        result = graph.outputs[first_result + index]
        boundary(
            reader,
            f"{body.owner}/scan_output:{value.name}",
            f"{node.op_type}.scan_output",
            inputs=[reader.name(result)],
            outputs=[reader.add_value(value, body.parent)],
            targets=[(graph, first_result + index)],
            body=body.parent,
            what=f"{node.op_type} scan output {value.name!r}: one type in the body and after",
            values=[result, value],
        )


def _final_shape(reader: Reader, boundary: OpNode) -> None:
    """Give a carried value's final value the shape it has at entry, in the body and as the
    body's result where all three agree (ONNX's inference leaves a Loop's carried outputs
    without one, and the checker wants a shape on every value a Cast after the loop makes
    intermediate); dims the three do not pin down are left unnamed."""
    tensors, values = reader.op_graph.tensors, reader.handles.values
    final = boundary.outputs[1]
    if not final or values[final].shape is not None:
        return
    shapes = [values[n].shape for n in (*boundary.inputs, boundary.outputs[0]) if n]
    if len(shapes) < 3 or any(shape is None for shape in shapes):
        return
    ranks = {len(shape) for shape in shapes}  # type: ignore[arg-type]
    if len(ranks) != 1:
        return
    dims = [
        first if all(shape[i] == first for shape in shapes) else None  # type: ignore[index]
        for i, first in enumerate(shapes[0])  # type: ignore[arg-type]
    ]
    values[final].shape = ir.Shape(dims)
    tensors[final].shape = tuple(d if isinstance(d, int) or d is None else d.value for d in dims)


def _agree(reader: Reader, node: ir.Node, boundary: OpNode) -> None:
    """Refuse a loop-carried value whose types disagree between entry, body and exit."""
    tensors = reader.op_graph.tensors
    named = [*boundary.inputs, *boundary.outputs]
    known = [(name, tensors[name].dtype) for name in named if name and tensors[name].dtype]
    known = [(name, dtype) for name, dtype in known if dtype != "unknown"]
    for name, dtype in known[1:]:
        if dtype != known[0][1]:
            raise GraphampError(
                f"node {boundary.name.rsplit('/carried:', 1)[0]!r} ({node.op_type}): carried "
                f"value {reader.op_graph.local_name(boundary.outputs[0])!r} is {known[0][1]} as "
                f"{known[0][0]!r} but {dtype} as {name!r}: a loop-carried value has one type "
                "at entry, in the body and at exit"
            )


def _owner_types(reader: Reader, op: str) -> frozenset[str]:
    """The float types a value crossing an If/Loop/Scan boundary may take: those its owner's
    schema admits at the model's opset (bfloat16 only from opset 16); any float type across a
    function's boundary."""
    owner = op.split(".", 1)[0]
    if owner not in ("If", "Loop", "Scan"):
        return FLOAT_TYPES
    found = schemas.schema(owner, slots.opset_of(reader.opsets, ""), "")
    if found is None:
        return FLOAT_TYPES
    return frozenset().union(*(types & FLOAT_TYPES for types in found.allowed.values()))


def boundary(
    reader: Reader,
    name: str,
    op: str,
    *,
    inputs: list[str],
    outputs: list[str],
    targets: list[Target],
    body: str,
    what: str,
    values: list[ir.Value | None],
    back: bool = False,
    sequence: bool = False,
) -> OpNode:
    """Add a boundary node; its slots follow one type when every value is a tensor (a
    sequence cannot be cast: ``sequence`` says one is where the types do not) and one of them
    is float."""
    op_graph = reader.op_graph
    node = OpNode(
        name=unique_name(name, reader.taken_nodes),
        op=op,
        inputs=inputs,
        outputs=outputs,
        kind=NodeKind.BOUNDARY,
        scope=name.rsplit("/", 1)[-1],
        body=body,
        back_inputs=frozenset({1}) if back else frozenset(),
        params={"boundary": what},
    )
    dtypes = [op_graph.tensors[n].dtype for n in (*inputs, *outputs) if n]
    floats = [d for d in dtypes if d in FLOAT_TYPES]
    tensors = not sequence and all(
        v is None or v.type is None or isinstance(v.type, ir.TensorType) for v in values
    )
    if floats and not tensors:
        node.params = {**node.params, "kept": "a sequence or optional crosses it: kept in its type"}
    elif floats:
        node.follow_inputs = frozenset(range(len(inputs)))
        node.follow_outputs = frozenset(i for i, out in enumerate(outputs) if out)
        node.allowed_types = _owner_types(reader, op)
        node.schema_source = f"opset {slots.opset_of(reader.opsets, '')}"
        node.compute_type = floats[0]
        for out in outputs:  # a body parameter declared with no type has the value's
            if out and op_graph.tensors[out].dtype == UNKNOWN:
                op_graph.tensors[out].dtype = floats[0]
                reader.handles.values[out].dtype = ir_type(floats[0])
    for out in outputs:
        if out:
            op_graph.tensors[out].producer = node.name
    op_graph.add_node(node)
    reader.handles.boundaries[node.name] = targets
    return node
