"""What the ONNX reader shares with the helpers it calls and with the writer: the
onnx_ir objects behind the OpGraph's names (:class:`OnnxHandles`), the calls of model-local
functions read, and the reader as the body and function readers call back through it
(:class:`Reader`).

The reader (:mod:`graphamp.onnx.reader`) hands a node that owns a body to
:mod:`graphamp.onnx.bodies` or :mod:`graphamp.onnx.functions`, which read the body's nodes back
through the reader: both sides name this module, not each other, so the three read apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import onnx_ir as ir

from graphamp.core.graph import Body, OpGraph

FunctionId = tuple[str, str, str]  # domain, name, overload


@dataclass
class CallSite:
    """One call of a model-local function and the copy of it read for that call."""

    node: ir.Node
    function: FunctionId
    copy: ir.Function
    attributes: dict[str, ir.Attr]  # what its references resolve to (the call's, defaults)


@dataclass
class OnnxHandles:
    """The onnx_ir objects the OpGraph's names stand for."""

    nodes: dict[str, ir.Node] = field(default_factory=dict)
    values: dict[str, ir.Value] = field(default_factory=dict)
    # Boundary nodes: where each input slot is read in the model, as (node, input index) or
    # (body graph, output index): what rewiring the slot changes.
    boundaries: dict[str, list[tuple[ir.Node | ir.Graph, int]]] = field(default_factory=dict)
    # Each body graph read (by id): the Body it is, and the graph its owner sits in.
    bodies: dict[int, tuple[Body, ir.Graph]] = field(default_factory=dict)
    # Each call of a model-local function, with the copy read for it, in reading order.
    calls: list[CallSite] = field(default_factory=list)


class Reader(Protocol):
    """What the body and function readers use of the graph reader
    (:class:`graphamp.onnx.reader.GraphReader` is the one there is)."""

    model: ir.Model
    opsets: dict[str, int]
    op_graph: OpGraph
    handles: OnnxHandles
    taken_nodes: set[str]  # node names given out
    calling: list[FunctionId]  # the functions being read, outermost first
    bound: dict[str, ir.Attr] | None  # what the innermost function read was called with

    def attributes(self, node: ir.Node) -> dict[str, ir.Attr]: ...

    def name(self, value: ir.Value | None) -> str: ...

    def add_value(self, value: ir.Value, body: str, *, graph_input: bool = False) -> str: ...

    def read_body(self, graph: ir.Graph, body: Body, outer: ir.Graph) -> None: ...
