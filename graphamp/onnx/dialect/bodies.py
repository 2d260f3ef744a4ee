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

The writer maps a boundary's input slots back to where the model reads them (an owner's input
or a body's result: ``ProtoHandles.boundaries``), and the values it produces to the node of the
model that does (``ProtoHandles.producers``). A node of another kind with a body (a contrib
op's beam search, FlexAttention's score functions) is kept whole."""

from __future__ import annotations

import onnx

from graphamp.core import dtypes as dtype_table
from graphamp.core.dtypes import FLOAT_TYPES, UNKNOWN
from graphamp.core.graph import Body, BodyKind, NodeKind, OpNode, unique_name
from graphamp.errors import GraphampError
from graphamp.onnx.dialect import schemas, slots
from graphamp.onnx.dialect.handles import Reader, Scope, Target


def enter(reader: Reader, scope: Scope, index: int, op_node: OpNode) -> bool:
    """Read the bodies of node ``index`` of ``scope`` if it is an If, Loop, Scan or
    SequenceMap, with ``op_node`` (its name, inputs and body already set) as their owner;
    False for any other node."""
    fields = scope.nodes[index]
    if fields.domain not in slots.DEFAULT_DOMAINS:
        return False
    enter_op = _ENTER.get(fields.op_type)
    if enter_op is None:
        return False
    enter_op(_Owner(reader, scope, index, op_node))
    return True


class _Owner:
    """The node whose bodies are read, and what reading them needs at hand."""

    def __init__(self, reader: Reader, scope: Scope, index: int, op_node: OpNode) -> None:
        self.reader, self.scope, self.index, self.op_node = reader, scope, index, op_node
        self.fields = scope.nodes[index]
        self.path, self.outer = op_node.name, op_node.body
        self.op_type = self.fields.op_type

    def name(self, local: str) -> str:
        return self.reader.name(self.scope, local)

    def graph(self, attribute: str) -> onnx.GraphProto:
        for found in self.fields.attributes:
            if found.name == attribute and found.type == onnx.AttributeProto.GRAPH:
                return found.g
        node = self.scope.names[self.index]
        raise GraphampError(f"node {node!r} ({self.op_type}) has no {attribute} graph")

    def arity(self, what: str, expected: int, found: int) -> None:
        """Refuse a body whose parameters or results do not match the owner's inputs or
        outputs (``what``: "<body> takes" or "<body> returns")."""
        if expected != found:
            raise GraphampError(
                f"node {self.path!r} ({self.op_type}): {what} {found} values where the "
                f"{self.op_type} needs {expected}"
            )

    def own(self, inputs: list[str], bodies: list[str]) -> None:
        """Add the owner: a CONTROL_FLOW node reading ``inputs``."""
        op_node = self.op_node
        op_node.kind = NodeKind.CONTROL_FLOW
        op_node.inputs = inputs
        op_node.bodies = tuple(bodies)
        self.reader.add_node(op_node)

    def body(self, attribute: str, graph: onnx.GraphProto, kind: BodyKind) -> Scope:
        body = Body(f"{self.path}/{attribute}", kind, owner=self.path, parent=self.outer)
        return self.reader.open_body(self.scope, self.index, attribute, graph, body)


def _body(scope: Scope) -> Body:
    """The Body of ``scope``, a node's body (which every scope opened here is)."""
    assert scope.body is not None
    return scope.body


def _enter_if(owner: _Owner) -> None:
    reader, fields = owner.reader, owner.fields
    branches = [(name, owner.graph(name)) for name in ("then_branch", "else_branch")]
    owner.own([owner.name(fields.inputs[0])], [f"{owner.path}/{a}" for a, _ in branches])
    scopes = []
    for attribute, graph in branches:
        owner.arity(f"{attribute} returns", len(fields.outputs), len(graph.output))
        inner = owner.body(attribute, graph, BodyKind.BRANCH)
        reader.read_body(inner)
        _body(inner).outputs = [reader.name(inner, v.name) for v in graph.output]
        scopes.append(inner)
    for index, local in enumerate(fields.outputs):
        results = [inner.graph.output[index].name for inner in scopes]
        boundary(
            owner,
            f"{owner.path}/output:{local}",
            "If.output",
            inputs=[reader.name(inner, r) for inner, r in zip(scopes, results, strict=True)],
            outputs=[reader.add_value(owner.scope, local)],
            targets=[(inner, -1, index) for inner in scopes],
            body=owner.outer,
            what=f"If output {local!r}: one type in both branches and after the If",
            types=[
                *(reader.type_of(s, r) for s, r in zip(scopes, results, strict=True)),
                reader.type_of(owner.scope, local),
            ],
        )


def _enter_loop(owner: _Owner) -> None:
    reader, fields = owner.reader, owner.fields
    graph = owner.graph("body")
    initial = list(fields.inputs[2:])
    owner.arity("its body takes", len(initial) + 2, len(graph.input))
    owner.arity("its body returns", len(fields.outputs) + 1, len(graph.output))
    head = [owner.name(v) for v in fields.inputs[:2]]
    inner = owner.body("body", graph, BodyKind.LOOP)
    owner.own(head + [""] * (2 - len(head)), [inner.path])
    for value in graph.input[:2]:  # the iteration number and the condition
        reader.add_value(inner, value.name)
    carried = _carried(owner, inner, initial, first_input=2, first_param=2)
    reader.read_body(inner)
    _close(owner, inner, carried, first_result=1)


def _enter_scan(owner: _Owner) -> None:
    reader, fields = owner.reader, owner.fields
    graph = owner.graph("body")
    lengths = 1 if slots.opset_of(reader.opsets, "") < 9 else 0  # Scan 8's sequence_lens
    scanned = next(a.i for a in fields.attributes if a.name == "num_scan_inputs")
    count = len(fields.inputs) - lengths - scanned
    owner.arity("its body takes", len(fields.inputs) - lengths, len(graph.input))
    owner.arity("its body returns", len(fields.outputs), len(graph.output))
    inner = owner.body("body", graph, BodyKind.LOOP)
    owner.own([owner.name(v) for v in fields.inputs[:lengths]], [inner.path])
    initial = list(fields.inputs[lengths : lengths + count])
    carried = _carried(owner, inner, initial, first_input=lengths, first_param=0)
    for index in range(count, len(graph.input)):
        parameter = graph.input[index].name
        source = fields.inputs[lengths + index]
        boundary(
            owner,
            f"{owner.path}/scan_input:{parameter}",
            "Scan.scan_input",
            inputs=[owner.name(source)],
            outputs=[reader.add_value(inner, parameter)],
            targets=[(owner.scope, owner.index, lengths + index)],
            body=owner.outer,
            what=f"Scan input {parameter!r}: one type outside and in the body",
            types=[reader.type_of(owner.scope, source), reader.type_of(inner, parameter)],
        )
    reader.read_body(inner)
    _close(owner, inner, carried, first_result=0)


def _enter_sequence_map(owner: _Owner) -> None:
    reader, fields = owner.reader, owner.fields
    graph = owner.graph("body")
    owner.arity("its body takes", len(fields.inputs), len(graph.input))
    owner.arity("its body returns", len(fields.outputs), len(graph.output))
    inner = owner.body("body", graph, BodyKind.LOOP)
    owner.own([], [inner.path])
    for index, (source, parameter) in enumerate(zip(fields.inputs, graph.input, strict=True)):
        source_type = reader.type_of(owner.scope, source)
        boundary(
            owner,
            f"{owner.path}/input:{parameter.name}",
            "SequenceMap.input",
            inputs=[owner.name(source)],
            outputs=[reader.add_value(inner, parameter.name)],
            targets=[(owner.scope, owner.index, index)],
            body=owner.outer,
            what=f"SequenceMap input {parameter.name!r}: one type outside and in the body",
            types=[source_type, reader.type_of(inner, parameter.name)],
            # the first input is a sequence; another is one unless its type says otherwise
            sequence=index == 0 or not source or not _is_tensor(source_type, untyped=False),
        )
    reader.read_body(inner)
    body = _body(inner)
    body.inputs = [reader.name(inner, v.name) for v in graph.input]
    body.outputs = [reader.name(inner, v.name) for v in graph.output]
    for index, (result, local) in enumerate(zip(graph.output, fields.outputs, strict=True)):
        boundary(
            owner,
            f"{owner.path}/output:{local}",
            "SequenceMap.output",
            inputs=[reader.name(inner, result.name)],
            outputs=[reader.add_value(owner.scope, local)],
            targets=[(inner, -1, index)],
            body=owner.outer,
            what=f"SequenceMap output {local!r}: one type in the body and after",
            types=[reader.type_of(inner, result.name), reader.type_of(owner.scope, local)],
            sequence=True,
        )


def _carried(
    owner: _Owner, inner: Scope, initial: list[str], *, first_input: int, first_param: int
) -> list[OpNode]:
    """A boundary node per loop-carried value (Loop) or state variable (Scan), before the
    body is read: it produces the body's parameter. Its back input, the body's next value, is
    filled in by :func:`_close`. ``first_input``/``first_param``: the first carried input of
    the node and parameter of the body (a Loop's come after its trip count and condition)."""
    reader, graph = owner.reader, inner.graph
    first_result = first_param // 2  # a Loop's body returns its condition first
    carried = []
    for index, source in enumerate(initial):
        parameter = graph.input[first_param + index].name
        final = owner.fields.outputs[index]
        result = graph.output[first_result + index].name
        outputs = [reader.add_value(inner, parameter), reader.add_value(owner.scope, final)]
        carried.append(
            boundary(
                owner,
                f"{owner.path}/carried:{parameter}",
                f"{owner.op_type}.carried",
                inputs=[owner.name(source), ""],
                outputs=outputs,
                targets=[
                    (owner.scope, owner.index, first_input + index),
                    (inner, -1, first_result + index),
                ],
                body=owner.outer,
                what=f"{owner.op_type} carried value {parameter!r}: one type at entry, in"
                " the body and at exit",
                types=[
                    reader.type_of(owner.scope, source),
                    reader.type_of(inner, parameter),
                    reader.type_of(owner.scope, final),
                    reader.type_of(inner, result),
                ],
                back=True,
            )
        )
    return carried


def _close(owner: _Owner, inner: Scope, carried: list[OpNode], *, first_result: int) -> None:
    """After the body is read: the carried values' back inputs, and a boundary node per scan
    output."""
    reader, graph, body = owner.reader, inner.graph, _body(inner)
    body.inputs = [reader.name(inner, v.name) for v in graph.input]
    body.outputs = [reader.name(inner, v.name) for v in graph.output]
    for index, value in enumerate(carried):
        value.inputs[1] = body.outputs[first_result + index]
        _agree(owner, value)
        _final_shape(owner, value)
    for index in range(len(carried), len(owner.fields.outputs)):
        local = owner.fields.outputs[index]
        result = graph.output[first_result + index].name
        boundary(
            owner,
            f"{owner.path}/scan_output:{local}",
            f"{owner.op_type}.scan_output",
            inputs=[reader.name(inner, result)],
            outputs=[reader.add_value(owner.scope, local)],
            targets=[(inner, -1, first_result + index)],
            body=owner.outer,
            what=f"{owner.op_type} scan output {local!r}: one type in the body and after",
            types=[reader.type_of(inner, result), reader.type_of(owner.scope, local)],
        )


def _final_shape(owner: _Owner, boundary: OpNode) -> None:
    """Give a carried value's final value the shape it has at entry, in the body and as the
    body's result where all three agree (ONNX's inference leaves a Loop's carried outputs
    without one, and the checker wants a shape on every value a Cast after the loop makes
    intermediate); dims the three do not pin down are left unnamed."""
    tensors = owner.reader.op_graph.tensors
    final = boundary.outputs[1]
    if not final or tensors[final].shape is not None:
        return
    named = [n for n in (*boundary.inputs, boundary.outputs[0]) if n]
    shapes = [shape for n in named if (shape := tensors[n].shape) is not None]
    if len(shapes) < 3 or len(shapes) != len(named):
        return
    ranks = {len(shape) for shape in shapes}
    if len(ranks) != 1:
        return
    dims = [
        first if all(shape[i] == first for shape in shapes) else None
        for i, first in enumerate(shapes[0])
    ]
    owner.reader.set_type(final, None, dims)
    tensors[final].shape = tuple(dims)


def _agree(owner: _Owner, boundary: OpNode) -> None:
    """Refuse a loop-carried value whose types disagree between entry, body and exit."""
    op_graph = owner.reader.op_graph
    tensors = op_graph.tensors
    named = [*boundary.inputs, *boundary.outputs]
    known = [(name, tensors[name].dtype) for name in named if name and tensors[name].dtype]
    known = [(name, dtype) for name, dtype in known if dtype != "unknown"]
    for name, dtype in known[1:]:
        if dtype != known[0][1]:
            raise GraphampError(
                f"node {owner.path!r} ({owner.op_type}): carried "
                f"value {op_graph.local_name(boundary.outputs[0])!r} is {known[0][1]} as "
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


def _is_tensor(type_bytes: bytes | None, *, untyped: bool = True) -> bool:
    """Whether a value of this TypeProto is a tensor (``untyped``: a value of no known type)."""
    if type_bytes is None:
        return untyped
    which = onnx.TypeProto.FromString(type_bytes).WhichOneof("value")
    return which == "tensor_type" or (which is None and untyped)


def boundary(
    owner: _Owner | None,
    name: str,
    op: str,
    *,
    inputs: list[str],
    outputs: list[str],
    targets: list[Target],
    body: str,
    what: str,
    types: list[bytes | None],
    back: bool = False,
    sequence: bool = False,
    reader: Reader | None = None,
    producer: tuple[Scope, int] | None = None,
) -> OpNode:
    """Add a boundary node; its slots follow one type when every value is a tensor (a
    sequence cannot be cast: ``sequence`` says one is where the types do not) and one of them
    is float. The values it produces in ``body`` are the owner's outputs (``producer``, the
    owner's by default), those in the body its parameters."""
    if owner is not None:
        reader, producer = owner.reader, (owner.scope, owner.index)
    assert reader is not None
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
    found = [op_graph.tensors[n].dtype for n in (*inputs, *outputs) if n]
    floats = [d for d in found if d in FLOAT_TYPES]
    tensors = not sequence and all(_is_tensor(t) for t in types)
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
                reader.set_type(out, dtype_table.BY_NAME[floats[0]].onnx, None)
    for out in outputs:
        if out:
            op_graph.tensors[out].producer = node.name
            inside = op_graph.tensors[out].body != body
            reader.handles.producers[out] = None if inside else producer
    op_graph.add_node(node)
    reader.handles.boundaries[node.name] = targets
    return node


_ENTER = {"If": _enter_if, "Loop": _enter_loop, "Scan": _enter_scan}
_ENTER["SequenceMap"] = _enter_sequence_map
