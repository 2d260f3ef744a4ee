"""What the ONNX reader shares with the body and function readers it calls and with the writer:
the graphs read (:class:`Scope`: the main graph, each If/Loop/Scan body, each model-local
function at each of its calls), where each OpGraph name sits in them (:class:`ProtoHandles`),
and the reader as the body and function readers call back through it (:class:`Reader`).

The reader (:mod:`graphamp.onnx.dialect.reader`) hands a node that owns a body to
:mod:`graphamp.onnx.dialect.bodies` or :mod:`graphamp.onnx.dialect.functions`, which read the body
back through the reader: both sides name this module, not each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import onnx

from graphamp.core.graph import Body, OpGraph, OpNode
from graphamp.onnx.validation.validate_nodes import NodeFields

if TYPE_CHECKING:
    from graphamp.onnx.io.proto_model import ProtoModel

FunctionId = tuple[str, str, str]  # domain, name, overload


@dataclass(eq=False)
class Scope:
    """One graph of the model as read: the main graph (``path`` ""), a body of a node of
    ``parent`` (``owner``'s attribute ``attribute``) or a function's copy at one call site."""

    path: str
    graph: onnx.GraphProto  # a function call's: the function's nodes, inputs and outputs
    nodes: list[NodeFields]
    names: list[str]  # each node's name in the model (an unnamed or repeated one given one)
    renamed: dict[int, str] = field(default_factory=dict)  # node index -> the name given
    paths: list[str] = field(default_factory=list)  # each node's name in the OpGraph
    # local value name -> OpGraph name, of the values this graph defines (None: the main
    # graph, whose values keep their names)
    values: dict[str, str] | None = None
    types: dict[str, bytes] = field(default_factory=dict)  # local name -> TypeProto bytes
    declared: dict[str, onnx.ValueInfoProto] = field(default_factory=dict)  # as ProtoModel's
    parent: Scope | None = None
    owner: int = -1  # the node of ``parent`` that owns this body
    attribute: str = ""  # the attribute of that node holding it
    index: int = 0  # its place in a GRAPHS attribute
    body: Body | None = None
    # A function's copy sees nothing of the graphs around its call.
    closed: bool = False
    # The inferred graph of the same structure (types for bodies), if inference ran.
    inferred: onnx.GraphProto | None = None


@dataclass(eq=False)
class CallSite:
    """One call of a model-local function and the copy of it read for that call."""

    scope: Scope  # the graph the call sits in
    node: int  # the call's index in it
    function: FunctionId
    copy: Scope  # the function's copy read for this call
    attributes: dict[str, onnx.AttributeProto]  # what its references resolve to


# Where a boundary node's input slot is read in the model: an input of a node
# (scope, node index, input index) or a result of a body (scope, -1, output index).
Target = tuple[Scope, int, int]


@dataclass
class ProtoHandles:
    """Where the OpGraph's names sit in the model (the main graph's nodes and values keep
    their names and are not listed)."""

    scopes: list[Scope] = field(default_factory=list)  # every graph read, main graph first
    nodes: dict[str, tuple[Scope, int]] = field(default_factory=dict)  # bodies' nodes
    values: dict[str, tuple[Scope, str]] = field(default_factory=dict)  # bodies' values
    boundaries: dict[str, list[Target]] = field(default_factory=dict)
    calls: list[CallSite] = field(default_factory=list)  # in reading order: innermost first
    # The model's functions, their unnamed nodes named (what the output holds).
    functions: dict[FunctionId, onnx.FunctionProto] = field(default_factory=dict)
    # Values a boundary node produces: the node of the model that does ((scope, index); None
    # for a body's parameter, which no node produces).
    producers: dict[str, tuple[Scope, int] | None] = field(default_factory=dict)


class Reader(Protocol):
    """What the body and function readers use of the graph reader."""

    model: ProtoModel
    opsets: dict[str, int]
    op_graph: OpGraph
    handles: ProtoHandles
    taken_nodes: set[str]  # node names given out
    functions: dict[FunctionId, onnx.FunctionProto]  # the model's, unnamed nodes named
    calling: list[FunctionId]  # the functions being read, outermost first
    # What the innermost function being read was called with (None outside functions).
    bound: dict[str, onnx.AttributeProto] | None

    def resolve(self, scope: Scope, local: str) -> str | None: ...

    def name(self, scope: Scope, local: str) -> str: ...

    def type_of(self, scope: Scope, local: str) -> bytes | None: ...

    def add_value(self, scope: Scope, local: str, *, graph_input: bool = False) -> str: ...

    def open_body(
        self, scope: Scope, node: int, attribute: str, graph: onnx.GraphProto, body: Body
    ) -> Scope: ...

    def read_body(self, scope: Scope) -> None: ...

    def add_node(self, node: OpNode) -> None: ...

    def is_tensor(self, name: str) -> bool: ...

    def set_type(
        self, name: str, elem_type: int | None, shape: list[int | str | None] | None
    ) -> None: ...
