"""Statistics of every intermediate value, computed inside the graph.

Calibration and debugging need, per tensor, a few numbers (its largest finite magnitude, its
smallest non-zero one, how far it is from float32). Asking onnxruntime for every intermediate
as a graph output would hold them all in memory at once (gigabytes on a BERT-base); instead
the statistics are reductions added to the graph, so each intermediate is reduced to scalars
right where it is made and freed as usual: memory stays that of the model (two copies of it
when comparing). The added nodes follow their tensor in the node order, which onnxruntime's
default execution order keeps.

Only float32 values are measured (what a conversion may make low); graph inputs count.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

import onnx
from onnx import helper, numpy_helper

from graphamp.core.graph import unique_name
from graphamp.onnx.io.files import inferred_types
from graphamp.onnx.io.subgraphs import bodies

F32 = onnx.TensorProto.FLOAT
REF = "graphamp.ref/"  # prefix of the float32 reference copy's names in a comparison model
STAT = "graphamp.stat/"  # prefix of the statistics' names
_INF, _ZERO = f"{STAT}inf", f"{STAT}zero"

# What each statistic is, and how batches combine: max, min or sum.
RANGE_STATS = {"max_abs": "max", "min_abs": "min", "nonfinite": "sum"}
# Per batch, for a comparison: the sums tell whether a tensor holds inf/NaN (a sum of finite
# values is finite; one inf or NaN makes it inf or NaN), with one pass each.
COMPARE_STATS = ("ref_sum", "sum", "max_abs", "max_diff")


def stat_name(tensor: str, stat: str) -> str:
    return f"{STAT}{tensor}|{stat}"


def node_names(graph: onnx.GraphProto) -> list[str]:
    """The names of ``graph``'s nodes as graphamp's reader names them (an unnamed node is
    ``Op__firstoutput``, a name shared with an earlier node gets ``_1``), so that they are the
    plan's and ``deny_names``' names."""
    taken = {node.name for node in graph.node if node.name}
    seen: set[str] = set()
    names = []
    for node in graph.node:
        name = node.name
        if not name:
            first = next((o for o in node.output if o), "")
            name = unique_name(f"{node.op_type}__{first}" if first else node.op_type, taken)
        elif name in seen:
            name = unique_name(name, taken)
        seen.add(name)
        names.append(name)
    return names


def named(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` whose nodes carry the names the reader gives them (in the main
    graph and, each in its own graph, in the bodies of control flow)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    pending = [copy.graph]
    while pending:
        graph = pending.pop()
        for node, name in zip(graph.node, node_names(graph), strict=True):
            node.name = name
            pending.extend(bodies(node))
    return copy


def float32_values(proto: onnx.ModelProto, types: dict[str, int] | None = None) -> list[str]:
    """The float32 values a conversion may make low, in graph order: graph inputs fed by the
    caller, then every node output (stored values excluded: their ranges are known)."""
    types = inferred_types(proto) if types is None else types
    stored = {init.name for init in proto.graph.initializer}
    names = [v.name for v in proto.graph.input if v.name not in stored]
    names += [out for node in proto.graph.node for out in node.output if out]
    return [name for name in names if types.get(name) == F32]


def with_range_stats(proto: onnx.ModelProto, tensors: list[str]) -> onnx.ModelProto:
    """``proto`` whose outputs are the :data:`RANGE_STATS` of ``tensors`` (and nothing else)."""
    model = model_shell(proto)
    stats: list[onnx.NodeProto] = []
    for tensor in tensors:
        stats += _range_nodes(tensor)
    model.graph.node.extend(_interleaved([list(proto.graph.node), stats]))
    model.graph.initializer.extend(proto.graph.initializer)
    model.graph.initializer.extend(_constants())
    model.graph.input.extend(proto.graph.input)
    _add_outputs(model, [stat_name(t, s) for t in tensors for s in RANGE_STATS])
    return model


def comparison(
    reference: onnx.ModelProto,
    other: onnx.ModelProto,
    tensors: list[str],
    shared: frozenset[str] = frozenset(),
) -> onnx.ModelProto:
    """One model running ``reference`` (renamed under :data:`REF`) beside ``other`` on the same
    graph inputs, with the :data:`COMPARE_STATS` of each tensor of ``tensors`` (a float32
    value of both) and both models' outputs (the reference's under :data:`REF`). ``shared``
    names initializers both models hold with the same values (the switchable model's are the
    float32 model's): the reference reads ``other``'s, so the weights are held once."""
    model = model_shell(other)
    inputs = {v.name for v in reference.graph.input} - {i.name for i in reference.graph.initializer}
    rename = _renamer(inputs | set(shared))
    ref_nodes = [_renamed_node(node, rename) for node in reference.graph.node]
    stats: list[onnx.NodeProto] = []
    for tensor in tensors:
        stats += _compare_nodes(rename(tensor), tensor, tensor)
    model.graph.node.extend(_interleaved([ref_nodes, list(other.graph.node), stats]))
    for init in reference.graph.initializer:
        if init.name in shared:
            continue
        copy = model.graph.initializer.add()
        copy.CopyFrom(init)
        copy.name = rename(init.name)
    model.graph.initializer.extend(other.graph.initializer)
    model.graph.initializer.extend(_constants())
    model.graph.input.extend(v for v in other.graph.input)
    _merge_opsets(model, reference)
    outputs = [rename(o.name) for o in reference.graph.output]
    outputs += [o.name for o in other.graph.output]
    outputs += [stat_name(t, s) for t in tensors for s in COMPARE_STATS]
    _add_outputs(model, outputs)
    return model


# -- statistics nodes --------------------------------------------------------------------------


def _range_nodes(tensor: str) -> list[onnx.NodeProto]:
    """Largest finite |x|, smallest non-zero finite |x| and the inf/NaN count of ``tensor``."""
    p = f"{STAT}{tensor}|"
    return [
        helper.make_node("Abs", [tensor], [f"{p}abs"]),
        helper.make_node("Less", [f"{p}abs", _INF], [f"{p}finite"]),  # NaN compares false
        helper.make_node("Where", [f"{p}finite", f"{p}abs", _ZERO], [f"{p}finite_abs"]),
        _reduce("ReduceMax", f"{p}finite_abs", stat_name(tensor, "max_abs")),
        helper.make_node("Greater", [f"{p}finite_abs", _ZERO], [f"{p}nonzero"]),
        helper.make_node("Where", [f"{p}nonzero", f"{p}abs", _INF], [f"{p}nonzero_abs"]),
        _reduce("ReduceMin", f"{p}nonzero_abs", stat_name(tensor, "min_abs")),
        helper.make_node("Not", [f"{p}finite"], [f"{p}nonfinite_mask"]),
        helper.make_node("Cast", [f"{p}nonfinite_mask"], [f"{p}nonfinite_count"], to=F32),
        _reduce("ReduceSum", f"{p}nonfinite_count", stat_name(tensor, "nonfinite")),
    ]


def _compare_nodes(reference: str, other: str, tensor: str) -> list[onnx.NodeProto]:
    """Per batch: the sums of ``reference`` and ``other`` (finite exactly when every element
    is), the largest |reference| and the largest |other - reference|: seven passes over the
    tensor (reading it is what costs, on a large model)."""
    p = f"{STAT}{tensor}|"
    return [
        _reduce("ReduceSum", reference, stat_name(tensor, "ref_sum")),
        _reduce("ReduceSum", other, stat_name(tensor, "sum")),
        helper.make_node("Abs", [reference], [f"{p}ref_abs"]),
        _reduce("ReduceMax", f"{p}ref_abs", stat_name(tensor, "max_abs")),
        helper.make_node("Sub", [other, reference], [f"{p}delta"]),
        helper.make_node("Abs", [f"{p}delta"], [f"{p}diff"]),
        _reduce("ReduceMax", f"{p}diff", stat_name(tensor, "max_diff")),
    ]


def _reduce(op: str, source: str, output: str) -> onnx.NodeProto:
    # No axes: every opset reduces over all axes (opset 13/18 moved axes to an input).
    return helper.make_node(op, [source], [output], keepdims=0)


def _constants() -> list[onnx.TensorProto]:
    import numpy as np

    return [
        numpy_helper.from_array(np.array(np.inf, np.float32), _INF),
        numpy_helper.from_array(np.array(0.0, np.float32), _ZERO),
    ]


# -- assembling models -------------------------------------------------------------------------


def model_shell(proto: onnx.ModelProto) -> onnx.ModelProto:
    """An empty model with ``proto``'s header: IR version, opsets, functions, metadata."""
    model = onnx.ModelProto()
    for descriptor, value in proto.ListFields():
        if descriptor.name == "graph":
            continue
        if descriptor.is_repeated:
            getattr(model, descriptor.name).extend(value)
        elif descriptor.type == descriptor.TYPE_MESSAGE:
            getattr(model, descriptor.name).CopyFrom(value)
        else:
            setattr(model, descriptor.name, value)
    model.graph.name = proto.graph.name or "graph"
    return model


def _merge_opsets(model: onnx.ModelProto, other: onnx.ModelProto) -> None:
    known = {o.domain: o for o in model.opset_import}
    for opset in other.opset_import:
        if opset.domain not in known:
            model.opset_import.append(opset)
        elif known[opset.domain].version < opset.version:
            known[opset.domain].version = opset.version
    model.ir_version = max(model.ir_version, other.ir_version)


def _add_outputs(model: onnx.ModelProto, names: Iterable[str]) -> None:
    for name in names:
        model.graph.output.append(onnx.ValueInfoProto(name=name))


def _renamer(keep: set[str]) -> Callable[[str], str]:
    def rename(name: str) -> str:
        return name if not name or name in keep else f"{REF}{name}"

    return rename


def _renamed_node(node: onnx.NodeProto, rename: Callable[[str], str]) -> onnx.NodeProto:
    """A copy of ``node`` with every value name (subgraphs' included) and its name renamed."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    _rename_in_place(copy, rename)
    return copy


def _rename_in_place(node: onnx.NodeProto, rename: Callable[[str], str]) -> None:
    node.name = rename(node.name)
    node.input[:] = [rename(n) for n in node.input]
    node.output[:] = [rename(n) for n in node.output]
    for graph in bodies(node):
        for value in (*graph.input, *graph.output, *graph.value_info):
            value.name = rename(value.name)
        for init in graph.initializer:
            init.name = rename(init.name)
        for inner in graph.node:
            _rename_in_place(inner, rename)


def _interleaved(groups: list[list[onnx.NodeProto]]) -> list[onnx.NodeProto]:
    """The nodes of ``groups`` (each in a topological order) in one topological order that
    runs each node as early as its inputs allow, earlier groups first, so a statistic follows
    its tensor and the two copies of a comparison advance together."""
    nodes = [(g, i, node) for g, group in enumerate(groups) for i, node in enumerate(group)]
    producer = {out: k for k, (_, _, node) in enumerate(nodes) for out in node.output if out}
    waiting: list[set[int]] = []
    readers: dict[int, list[int]] = {}
    for k, (_, _, node) in enumerate(nodes):
        needs = {producer[n] for n in _reads(node) if n in producer and producer[n] != k}
        waiting.append(needs)
        for p in needs:
            readers.setdefault(p, []).append(k)
    # Priority: the position of a node's latest input, then the group, then its own index.
    depth = [0] * len(nodes)
    ready = [(0, g, i, k) for k, (g, i, _) in enumerate(nodes) if not waiting[k]]
    heapq.heapify(ready)
    order: list[onnx.NodeProto] = []
    while ready:
        _, _, _, k = heapq.heappop(ready)
        order.append(nodes[k][2])
        for r in readers.get(k, []):
            waiting[r].discard(k)
            depth[r] = max(depth[r], len(order))
            if not waiting[r]:
                g, i, _ = nodes[r]
                heapq.heappush(ready, (depth[r], g, i, r))
    if len(order) != len(nodes):  # a cycle: impossible for valid models
        raise ValueError("statistics graph is not acyclic")
    return order


def _reads(node: onnx.NodeProto) -> list[str]:
    """Every value ``node`` reads, those its subgraphs read from outside included."""
    names = list(node.input)
    for graph in bodies(node):
        for inner in graph.node:
            names += _reads(inner)
    return names
