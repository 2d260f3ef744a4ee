"""OpGraph: the one neutral dataflow view that every pass works on.

A dialect (ONNX, FX, .pt2, ...) reads its model into an :class:`OpGraph`; the passes read only
this module's types and never import onnx or torch. The dialect records, per node, which input
and output slots carry the node's *computation type* (the slots that change type when the node
runs in low precision), from its own schema source (ONNX op schemas, aten schemas); everything
else about the node is opaque to the passes. Nothing here is specific to one dialect.

Dtypes are the names of :mod:`graphamp.core.dtypes` (``"float32"``, ``"bfloat16"``, ``"int64"``,
...) and ``"unknown"`` where neither type inference nor the dialect's fallback could tell.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from graphamp.core.dataflow import Dataflow
from graphamp.core.dtypes import FLOAT_TYPES, LOW_TYPES, UNKNOWN
from graphamp.errors import InternalError

__all__ = [
    "FLOAT_TYPES",
    "LOW_TYPES",
    "UNKNOWN",
    "Body",
    "BodyKind",
    "FusedKernel",
    "MatrixDims",
    "NodeKind",
    "OpGraph",
    "OpNode",
    "Role",
    "TensorInfo",
    "unique_name",
]


class NodeKind(enum.Enum):
    """What the dialect knows about a node, beyond its op type."""

    OP = "op"  # an op with a schema: its computation-type slots are known
    CAST = "cast"  # a dtype conversion already in the model; ``cast_to`` is its target
    CONSTANT = "constant"  # produces a stored value (ONNX Constant)
    # owns bodies (If/Loop/Scan, a function call, torch.cond): entered when ``bodies`` names
    # them (their nodes are in the graph), else kept whole, reading outer values implicitly
    CONTROL_FLOW = "control_flow"
    # one value across a body's boundary (an If output and its branches' results, a loop-carried
    # value at entry, in the body and at exit, a function's parameter): every slot one type
    BOUNDARY = "boundary"
    OPAQUE = "opaque"  # no schema (a custom domain): kept as it is
    # Nodes the training passes add to a training-step graph (``params`` holds their settings):
    LOSS_SCALE = "loss_scale"  # the backward seed multiplied by the loss scale
    UNSCALE = "unscale"  # gradients multiplied by 1 / scale
    FINITE_CHECK = "finite_check"  # one boolean: does any gradient hold inf or NaN?
    STEP_GUARD = "step_guard"  # an updated value, or the old one when the step is skipped
    SCALE_UPDATE = "scale_update"  # the dynamic loss scale's next state
    SKIP_COUNT = "skip_count"  # the number of skipped steps, plus this one if skipped
    ALL_REDUCE = "all_reduce"  # values reduced over a process group (mean of gradients, max)
    CLIP_GRAD_NORM = "clip_grad_norm"  # gradients scaled down to a largest global norm
    ALL_GATHER = "all_gather"  # whole parameters gathered from every rank's shard
    REDUCE_SCATTER = "reduce_scatter"  # gradients averaged over the ranks, each keeping its shard
    AMAX = "amax"  # float8 scaling: the largest |x| of a value (per tensor or per row)
    QUANTIZE = "quantize"  # a value times its scale, clamped and cast to float8
    SCALE_UPDATE_FP8 = "scale_update_fp8"  # a delayed-scaling amax history and scale's next state
    FLOAT8_GEMM = "float8_gemm"  # a matrix product of two quantised values and their scales


class BodyKind(enum.StrEnum):
    """How often a body runs per run of the node that owns it."""

    BRANCH = "branch"  # at most once (an If branch, a torch.cond branch)
    LOOP = "loop"  # once per iteration (a Loop or Scan body, a while_loop body, map)
    FUNCTION = "function"  # once (a function's body, at one call site)


@dataclass(slots=True)
class Body:
    """A scope of the graph: its nodes and values are named ``<path>/<own name>`` and sit in
    the same OpGraph as the main graph's, decided by the same passes.

    ``path`` is ``<owner>/<attribute>`` (``if/then_branch``, ``loop/body``) or, for a
    function at one call site, ``<call node>/<function>``; ``parent`` is the body the owner
    sits in ("" for the main graph). The values a body reads from an enclosing scope are read
    by name, like any other (an edge that crosses scopes); the values that cross its boundary
    as parameters and results go through ``BOUNDARY`` nodes.
    """

    path: str
    kind: BodyKind
    owner: str
    parent: str = ""
    inputs: list[str] = field(default_factory=list)  # its parameters, in order
    outputs: list[str] = field(default_factory=list)  # its results, in order


class Role(enum.StrEnum):
    """What a value is in a training-step graph, as the dialect marked it."""

    LOSS = "loss"  # the (unscaled, float32) loss
    GRAD_SEED = "grad_seed"  # the seed backward starts from (d loss / d loss)
    GRADIENT = "gradient"  # a parameter's gradient, as the optimizer reads it
    UPDATE = "update"  # a parameter or optimizer state after the update (``replaces`` the old)


@dataclass(slots=True)
class TensorInfo:
    """A value in the graph: a graph input, a stored constant or a node output."""

    name: str
    dtype: str
    shape: tuple[int | str | None, ...] | None = None
    producer: str | None = None  # node name; None for graph inputs and initializers
    body: str = ""  # the path of the body the value lives in ("" for the main graph)
    is_graph_input: bool = False
    is_graph_output: bool = False
    # The caller feeds this input in its declared type (a PyTorch module's arguments): the
    # conversion never retypes it.
    type_fixed: bool = False
    # For stored values (initializers, Constant outputs): loads the array when a pass needs it,
    # so that reading a graph does not touch gigabytes of weights.
    load_value: Callable[[], np.ndarray] | None = None
    # Stored outside the model (external data read from disk when asked): a conversion that is
    # about to write every such value may check its range as it writes (speculate_weights).
    on_disk: bool = False
    role: Role | None = None  # training-step graphs only
    replaces: str | None = None  # Role.UPDATE: the value this one is the new version of

    @property
    def is_constant(self) -> bool:
        return self.load_value is not None

    def stored_value(self) -> np.ndarray:
        """A stored value's array, loaded now (only constants hold one)."""
        if self.load_value is None:
            raise InternalError(f"{self.name!r} is computed, not stored: it holds no value")
        return self.load_value()

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_TYPES


@dataclass(slots=True)
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
    # Computation-type slots that may stay float32 while the node runs low: its kernel takes a
    # low input with float32 parameters (PyTorch's layer_norm, group_norm and rms_norm, as
    # they run under autocast). They do not decide the node's type by promotion, and a float32
    # value there is read as it is when the node runs low (a low one widens when it runs
    # float32).
    float32_params: frozenset[int] = frozenset()
    # Float types the computation type may take, from the op's schema.
    allowed_types: frozenset[str] = frozenset()
    # Which schema the slots came from, for reasons ("opset 22", "aten").
    schema_source: str = ""
    # why the target runtime has no kernel for this op in the low type ("" when it has one)
    no_kernel: str = ""
    # The dtype the computation type has in the input model ("float32" for a float32 op).
    compute_type: str | None = None
    # Values read from an enclosing scope by the node's subgraphs (control flow kept whole).
    implicit_inputs: list[str] = field(default_factory=list)
    # The path of the body the node sits in ("" for the main graph).
    body: str = ""
    # CONTROL_FLOW: the bodies it owns whose nodes the graph holds (empty: kept whole).
    bodies: tuple[str, ...] = ()
    # Slots that read what a loop body produced in the previous iteration (a loop-carried
    # value's next value): a back edge, exempt from the topological order.
    back_inputs: frozenset[int] = frozenset()
    cast_to: str | None = None  # NodeKind.CAST: the target dtype
    flops: int | None = None  # matrix ops with known shapes: 2 x multiply-adds
    matrix: MatrixDims | None = None  # matrix ops: the product's dimensions and operand slots
    # Where the node came from, for name rules: ONNX node name; FX module path.
    scope: str = ""
    # Settings of a node a pass added (the loss-scaling constants of a SCALE_UPDATE, ...).
    params: Mapping[str, float | str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MatrixDims:
    """The matrix product a matrix op computes, as its dialect reads it: Y[M, N] = A[M, K] @
    B[K, N], batch dimensions folded into M (a Conv's patches: K = C_in / groups x kernel,
    N = C_out). ``a`` and ``b`` are the input slots of A and B, ``n_axis`` B's axis over N
    (a MatMul's last, a transposed Gemm's or a Conv's 0); a dimension the shapes do not fix
    is None. The float8 pass reads it for its shape rules and to tell activations
    from stored values."""

    m: int | None
    k: int | None
    n: int | None
    a: int = 0
    b: int = 1
    n_axis: int = -1  # the axis of B that runs over N (a weight's output channels)


@dataclass(frozen=True)
class FusedKernel:
    """A fused op the dialect can write in place of a decomposed pattern (an RMSNorm's ops);
    ``build(name, inputs, outputs)`` gives its node with the slots the dialect's reader fills;
    ``ranks``, where the kernel takes only inputs of those ranks (None: any rank)."""

    op: str
    domain: str
    build: Callable[[str, list[str], list[str]], OpNode]
    ranks: tuple[int, ...] | None = None

    def takes(self, tensor: TensorInfo) -> bool:
        """Whether the kernel takes ``tensor`` as its main input (its rank, where it must
        have one of ``ranks``, known and one of them)."""
        if self.ranks is None:
            return True
        return tensor.shape is not None and len(tensor.shape) in self.ranks


class OpGraph:
    """Nodes and tensors of one graph and its bodies, in a topological order.

    ``nodes`` keeps the dialect's order, which is topological (a loop-carried value's back
    edge aside: ``OpNode.back_inputs``): passes iterate it for determinism. A body's nodes
    follow the node that owns it (``bodies`` holds each :class:`Body` by path). ``dataflow``
    is a :class:`Dataflow` with an edge producer -> consumer for every
    tensor that flows from a computation-type output slot to a computation-type input slot: the
    edges along which a precision can spread.
    """

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.nodes: dict[str, OpNode] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.graph_inputs: list[str] = []
        self.graph_outputs: list[str] = []
        self.bodies: dict[str, Body] = {}
        self._consumers: dict[str, list[tuple[str, int]]] | None = None
        self._dataflow: Dataflow | None = None
        self.fused_kernels: dict[str, FusedKernel] = {}  # by pattern ("rms_norm"), if any
        self.reserved: set[str] = set()  # names the model holds outside it (graphamp.core.names)

    # -- building ---------------------------------------------------------------------------

    def add_tensor(self, tensor: TensorInfo) -> None:
        self.tensors[tensor.name] = tensor

    def add_node(self, node: OpNode, *, after: str | None = None) -> None:
        """Add ``node`` at the end, or right after node ``after`` (keeping the order
        topological is the caller's part)."""
        if node.name in self.nodes:
            raise ValueError(f"duplicate node name {node.name!r}")
        if after is None:
            self.nodes[node.name] = node
        else:
            ordered = list(self.nodes.items())
            index = next(i for i, (name, _) in enumerate(ordered) if name == after)
            ordered.insert(index + 1, (node.name, node))
            self.nodes = dict(ordered)
        for out in node.outputs:  # (readers add every node here: one lookup per output)
            if (tensor := self.tensors.get(out) if out else None) is not None:
                tensor.producer = node.name
        self._changed()

    def add_node_after_inputs(self, node: OpNode) -> None:
        """Add ``node`` right after the last node producing one of its inputs (first when none
        does), so the order stays topological."""
        producers = {self.tensors[name].producer for name in node.inputs if name in self.tensors}
        order = list(self.nodes)
        last = max((order.index(p) for p in producers if p is not None), default=-1)
        ordered = list(self.nodes.items())
        ordered.insert(last + 1, (node.name, node))
        if node.name in self.nodes:
            raise ValueError(f"duplicate node name {node.name!r}")
        self.nodes = dict(ordered)
        for out in node.outputs:
            if out and out in self.tensors:
                self.tensors[out].producer = node.name
        self._changed()

    def add_body(self, body: Body) -> None:
        if body.path in self.bodies:
            raise ValueError(f"duplicate body path {body.path!r}")
        self.bodies[body.path] = body

    def replace_nodes(self, removed: list[str], node: OpNode) -> None:
        """Put ``node`` where the last of ``removed`` was (it must read nothing produced later)
        and drop them all with the values only they produced; ``node``'s outputs stay."""
        gone = set(removed)
        last = max(removed, key=list(self.nodes).index)
        ordered: dict[str, OpNode] = {}
        for name, existing in self.nodes.items():
            if name == last:
                ordered[node.name] = node
            if name not in gone:
                ordered[name] = existing
        for out in {o for n in removed for o in self.nodes[n].outputs} - set(node.outputs):
            self.tensors.pop(out, None)
        self.nodes = ordered
        for out in filter(None, node.outputs):  # "" is an output left out
            self.tensors[out].producer = node.name
        self._changed()

    def replace_input(self, node: str, slot: int, tensor: str) -> None:
        self.nodes[node].inputs[slot] = tensor
        self._changed()

    def _changed(self) -> None:
        self._consumers = None
        self._dataflow = None

    # -- queries ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[OpNode]:
        return iter(self.nodes.values())

    def __len__(self) -> int:
        return len(self.nodes)

    def tensor(self, name: str) -> TensorInfo:
        return self.tensors[name]

    def local_name(self, tensor: str) -> str:
        """A value's name inside its body (its name for a main-graph value)."""
        body = self.tensors[tensor].body
        return tensor[len(body) + 1 :] if body and tensor.startswith(f"{body}/") else tensor

    def enclosing(self, body: str) -> list[Body]:
        """The bodies from the outermost down to ``body`` ("" gives none)."""
        chain = []
        while body:
            found = self.bodies[body]
            chain.append(found)
            body = found.parent
        return chain[::-1]

    def with_role(self, role: Role) -> list[TensorInfo]:
        """The values marked ``role``, in the order they were added."""
        return [tensor for tensor in self.tensors.values() if tensor.role is role]

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
    def dataflow(self) -> Dataflow:
        """Edges along computation-type slots only (see the class docstring)."""
        if self._dataflow is None:
            flow = Dataflow(self.nodes)
            tensors, nodes = self.tensors, self.nodes
            for node in nodes.values():
                follow = node.follow_inputs
                if not follow:
                    continue
                inputs = node.inputs
                for slot in sorted(follow) if len(follow) > 1 else follow:
                    name = inputs[slot] if slot < len(inputs) else ""
                    tensor = tensors.get(name)
                    producer_name = tensor.producer if tensor is not None else None
                    if producer_name is None:
                        continue
                    producer = nodes[producer_name]
                    outputs = producer.outputs
                    for index in producer.follow_outputs:
                        if outputs[index] == name:
                            flow.add_edge(producer_name, node.name)
                            break
            self._dataflow = flow
        return self._dataflow

    def first_out_of_order(self) -> tuple[str, str] | None:
        """(node, tensor) for the first node that reads a value no earlier node produced and
        that is no graph input or stored value (a back input: that nothing produces); None
        when the order is topological."""
        produced = {name for name, t in self.tensors.items() if t.producer is None}
        for node in self.nodes.values():
            back = node.back_inputs
            for slot, name in enumerate(node.inputs):
                if name and name not in produced and slot not in back:
                    return node.name, name
            for name in node.implicit_inputs:
                if name not in produced:
                    return node.name, name
            produced.update(out for out in node.outputs if out)
        for node in self.nodes.values():
            for slot in node.back_inputs:
                name = node.inputs[slot]
                if name and name not in produced:
                    return node.name, name
        return None


def unique_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first not in ``taken`` (which it joins)."""
    name, index = base, 1
    while name in taken:
        name = f"{base}_{index}"
        index += 1
    taken.add(name)
    return name
