"""OpGraph: the one neutral dataflow view that every pass works on.

A dialect (``graphamp.onnx``, later ``graphamp.fx``) reads its model into an :class:`OpGraph`;
the passes read only this module's types and never import onnx or torch. The dialect records,
per node, which input and output slots carry the node's *computation type* (the slots that
change type when the node runs in low precision); everything else about the node is opaque to
the passes.

Dtypes are plain strings: ``"float32"``, ``"float16"``, ``"bfloat16"``, ``"float64"``,
``"int64"``, ... and ``"unknown"`` where neither type inference nor the local fallback could
tell.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

FLOAT_TYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
LOW_TYPES = frozenset({"float16", "bfloat16"})
UNKNOWN = "unknown"


class NodeKind(enum.Enum):
    """What the dialect knows about a node, beyond its op type."""

    OP = "op"  # an op with a schema: its computation-type slots are known
    CAST = "cast"  # a dtype conversion already in the model; ``attrs["to"]`` is its target
    CONSTANT = "constant"  # produces a stored value (ONNX Constant)
    CONTROL_FLOW = "control_flow"  # owns subgraphs (If/Loop/Scan); reads outer values implicitly
    OPAQUE = "opaque"  # no schema (a custom domain): kept as it is


@dataclass
class TensorInfo:
    """A value in the graph: a graph input, a stored constant or a node output."""

    name: str
    dtype: str
    shape: tuple[int | str | None, ...] | None = None
    producer: str | None = None  # node name; None for graph inputs and initializers
    is_graph_input: bool = False
    is_graph_output: bool = False
    # For stored values (initializers, Constant outputs): loads the array when a pass needs it,
    # so that reading a graph does not touch gigabytes of weights.
    load_value: Callable[[], np.ndarray] | None = None

    @property
    def is_constant(self) -> bool:
        return self.load_value is not None

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_TYPES


@dataclass
class OpNode:
    """One operation. ``inputs``/``outputs`` hold tensor names ("" for an omitted optional)."""

    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    kind: NodeKind = NodeKind.OP
    domain: str = ""
    # Slots bound to the node's computation type: they take the low type when the node runs
    # in low precision. Empty for nodes that compute on no float type.
    follow_inputs: frozenset[int] = frozenset()
    follow_outputs: frozenset[int] = frozenset()
    # Input slots whose type variable binds nothing else and admits every float type (Shape's
    # input, say): they read a tensor in whatever type it has, so they never need a cast.
    any_type_inputs: frozenset[int] = frozenset()
    # Float types the computation type may take, from the op's schema at the model's opset.
    allowed_types: frozenset[str] = frozenset()
    # The dtype the computation type has in the input model ("float32" for a float32 op).
    compute_type: str | None = None
    # Values read from an enclosing scope by the node's subgraphs (control flow only).
    implicit_inputs: list[str] = field(default_factory=list)
    attrs: dict[str, object] = field(default_factory=dict)
    # Where the node came from, for name rules: ONNX node name; FX module path later.
    scope: str = ""


class OpGraph:
    """Nodes and tensors of one (top-level) graph, in a topological order.

    ``nodes`` keeps the dialect's order, which is topological: passes iterate it for
    determinism. ``dataflow`` is a networkx view with an edge producer -> consumer for every
    tensor that flows from a computation-type output slot to a computation-type input slot: the
    edges along which a precision can spread.
    """

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.nodes: dict[str, OpNode] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.graph_inputs: list[str] = []
        self.graph_outputs: list[str] = []
        self.opset: int = 0
        # True where the caller feeds the inputs in their original type (a PyTorch module's
        # arguments): the casts pass then never retypes a graph input.
        self.inputs_fixed: bool = False
        self._consumers: dict[str, list[tuple[str, int]]] | None = None
        self._dataflow: nx.DiGraph | None = None

    # -- building ---------------------------------------------------------------------------

    def add_tensor(self, tensor: TensorInfo) -> None:
        self.tensors[tensor.name] = tensor

    def add_node(self, node: OpNode) -> None:
        if node.name in self.nodes:
            raise ValueError(f"duplicate node name {node.name!r}")
        self.nodes[node.name] = node
        for out in node.outputs:
            if out and out in self.tensors:
                self.tensors[out].producer = node.name
        self._consumers = None
        self._dataflow = None

    # -- queries ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[OpNode]:
        return iter(self.nodes.values())

    def __len__(self) -> int:
        return len(self.nodes)

    def tensor(self, name: str) -> TensorInfo:
        return self.tensors[name]

    def consumers(self, tensor: str) -> list[tuple[str, int]]:
        """(node name, input slot) pairs reading ``tensor``; the k-th implicit read of a node
        (from inside its subgraphs) uses slot ``-1 - k``."""
        if self._consumers is None:
            table: dict[str, list[tuple[str, int]]] = {}
            for node in self.nodes.values():
                for slot, name in enumerate(node.inputs):
                    if name:
                        table.setdefault(name, []).append((node.name, slot))
                for k, name in enumerate(node.implicit_inputs):
                    table.setdefault(name, []).append((node.name, -1 - k))
            self._consumers = table
        return self._consumers.get(tensor, [])

    @property
    def dataflow(self) -> nx.DiGraph:
        """Edges along computation-type slots only (see the class docstring)."""
        if self._dataflow is None:
            graph = nx.DiGraph()
            graph.add_nodes_from(self.nodes)
            for node in self.nodes.values():
                for slot in sorted(node.follow_inputs):
                    name = node.inputs[slot] if slot < len(node.inputs) else ""
                    producer_name = self.tensors[name].producer if name in self.tensors else None
                    if producer_name is None:
                        continue
                    producer = self.nodes[producer_name]
                    if any(producer.outputs[i] == name for i in producer.follow_outputs):
                        graph.add_edge(producer_name, node.name)
            self._dataflow = graph
        return self._dataflow
