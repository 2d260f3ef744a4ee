"""The data a viewer page carries: nodes, tensors, casts, groups and the laid-out views, as
compact JSON (columns of numbers, repeated strings stored once).

The page rebuilds everything it shows from this: the boxes and edges of each view, each
group's share of nodes per precision and its casts, search, filters, and the reason chain of
a node exactly as ``graphamp explain`` prints it (the node's decision, the neighbours its
colour came through, how each input reaches it).
"""

from __future__ import annotations

from dataclasses import dataclass

from graphamp.core.graph import OpGraph
from graphamp.plans.plan import Plan
from graphamp.plans.plandiff import PlanDiff
from graphamp.plans.records import BOUNDARY, CastRecord, NodeDecision
from graphamp.viewer.hierarchy import (
    Hierarchy,
    build_hierarchy,
    leaf_label,
    node_path,
    plumbing,
)
from graphamp.viewer.views import View, build_views, flows

KINDS = {"n": 0, "g": 1, "i": 2, "o": 3}
# node status on a diff page (0: the same in both plans; FP8_CHANGED: the same precision,
# but its float8 decision or an operand's scale record moved)
CHANGED, ADDED, REMOVED, FP8_CHANGED = 1, 2, 3, 4
# cast status on a diff page
CAST_SAME, CAST_ADDED, CAST_REMOVED = 0, 1, 2
# tensor flags
GRAPH_INPUT, GRAPH_OUTPUT, STORED = 1, 2, 4


class Strings:
    """Each distinct string once; columns hold indices into it."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, value: object) -> int:
        text = str(value)
        if text not in self._index:
            self._index[text] = len(self.values)
            self.values.append(text)
        return self._index[text]


@dataclass
class PageInput:
    """What one page shows: the graph, the decision drawn for each node, and on a diff page
    the other plan and the difference."""

    plan: Plan
    graph: OpGraph
    old: Plan | None = None
    diff: PlanDiff | None = None


def page_data(source: PageInput) -> dict[str, object]:
    plan, graph = source.plan, source.graph
    status = _statuses(source.diff)
    names = list(graph.nodes)
    extra = set(plan.nodes) | (set(source.old.nodes) if source.old else set())
    names += sorted(extra - set(graph.nodes))
    node_index = {name: i for i, name in enumerate(names)}
    tensor_names = list(graph.tensors)
    tensor_index = {name: i for i, name in enumerate(tensor_names)}
    casts, cast_status = _casts(source)
    paths = {node.name: node_path(node.name, getattr(node, "scope", "")) for node in graph}
    hierarchy = build_hierarchy(list(graph.nodes), paths=paths)
    hidden = plumbing(plan, graph) - set(status)
    views = _all_views(graph, hierarchy, hidden, casts)
    group_ids = list(hierarchy.groups)
    group_index = {gid: i for i, gid in enumerate(group_ids)}
    strings = Strings()
    return {
        "mode": "diff" if source.diff else "plan",
        "model": plan.model,
        "dtype": plan.dtype,
        "fp8": plan.fp8_settings is not None,
        "summary": plan.summary(),
        "diff": _diff_summary(source),
        "nodes": _nodes(
            source, names, node_index, tensor_index, hierarchy, group_index, hidden, status, strings
        ),
        "tensors": _tensors(graph, tensor_names, node_index, strings),
        "casts": [
            [
                tensor_index.get(c.tensor, -1),
                strings(c.src),
                strings(c.dst),
                c.output,
                [node_index[n] for n in c.consumers if n in node_index],
                0 if c.purpose == BOUNDARY else 1,
                cast_status[i],
                c.tensor,
                -1 if c.bytes is None else c.bytes,
            ]
            for i, c in enumerate(casts)
        ],
        "groups": {
            "id": group_ids,
            "label": [hierarchy.groups[g].label for g in group_ids],
            "parent": [
                -1 if (p := hierarchy.groups[g].parent) is None else group_index[p]
                for g in group_ids
            ],
            "part": [int(hierarchy.groups[g].part) for g in group_ids],
        },
        "views": {
            str(group_index[gid]): _group_views(per_group, node_index, group_index, tensor_index)
            for gid, per_group in views.items()
        },
        "strings": strings.values,
    }


def _statuses(diff: PlanDiff | None) -> dict[str, int]:
    if diff is None:
        return {}
    status = dict.fromkeys(diff.fp8_changed_nodes(), FP8_CHANGED)
    status.update({name: CHANGED for name, _, _ in diff.nodes_changed})
    status.update({name: ADDED for name, _ in diff.nodes_added})
    status.update({name: REMOVED for name, _ in diff.nodes_removed})
    return status


def _casts(source: PageInput) -> tuple[list[CastRecord], list[int]]:
    """The casts drawn: the plan's (boundary casts first, as ``explain`` searches them), then
    on a diff page the old plan's casts that are gone."""
    casts = list(source.plan.casts) + list(source.plan.output_casts)
    if source.diff is None:
        return casts, [CAST_SAME] * len(casts)
    added = {(c.tensor, c.dst, c.output) for c in source.diff.casts_added}
    status = [CAST_ADDED if (c.tensor, c.dst, c.output) in added else CAST_SAME for c in casts]
    casts += source.diff.casts_removed
    status += [CAST_REMOVED] * len(source.diff.casts_removed)
    return casts, status


def _all_views(
    graph: OpGraph, hierarchy: Hierarchy, hidden: set[str], casts: list[CastRecord]
) -> dict[str, dict[str, View]]:
    """Each group's view with every node ("all") and with plumbing hidden ("compute"; absent
    for a group that holds only plumbing)."""
    casts_at: dict[tuple[str, str], list[int]] = {}
    for index, cast in enumerate(casts):
        for reader in cast.consumers:
            casts_at.setdefault((cast.tensor, reader), []).append(index)
        if cast.purpose != BOUNDARY:
            casts_at.setdefault((cast.tensor, ""), []).append(index)
    order = {name: i for i, name in enumerate(graph.nodes)}
    everything = set(graph.nodes)
    full = build_views(hierarchy, order, everything, flows(graph, everything, casts_at))
    compute_nodes = everything - hidden
    compute = (
        build_views(hierarchy, order, compute_nodes, flows(graph, compute_nodes, casts_at))
        if hidden
        else full
    )
    out: dict[str, dict[str, View]] = {}
    for gid, view in full.items():
        out[gid] = {"all": view}
        if gid in compute:
            out[gid]["compute"] = compute[gid]
    return out


def _nodes(
    source: PageInput,
    names: list[str],
    node_index: dict[str, int],
    tensor_index: dict[str, int],
    hierarchy: Hierarchy,
    group_index: dict[str, int],
    hidden: set[str],
    status: dict[str, int],
    strings: Strings,
) -> dict[str, list[object]]:
    graph, plan, old = source.graph, source.plan, source.old
    columns: dict[str, list[object]] = {
        key: []
        for key in (
            "name",
            "leaf",
            "op",
            "precision",
            "rule",
            "reason",
            "via",
            "flops",
            "group",
            "plumbing",
            "inputs",
            "follows",
            "outputs",
            "planned",
            "status",
            "before",
            "fp8",
            "fp8_before",
        )
    }
    for name in names:
        decision = plan.nodes.get(name) or (old.nodes.get(name) if old else None)
        node = graph.nodes.get(name)
        columns["name"].append(name)
        columns["leaf"].append(hierarchy.labels.get(name, leaf_label(name)))
        columns["op"].append(strings(decision.op if decision else graph.nodes[name].op))
        columns["precision"].append(strings(decision.precision if decision else "unknown"))
        columns["rule"].append(strings(decision.rule if decision else ""))
        columns["reason"].append(strings(decision.reason if decision else "not in the plan"))
        via = decision.via if decision else None
        columns["via"].append(node_index.get(via, -1) if via else -1)
        columns["flops"].append(decision.flops if decision else None)
        columns["group"].append(group_index[hierarchy.group_of[name]] if node else -1)
        columns["plumbing"].append(int(name in hidden))
        columns["inputs"].append(
            [tensor_index.get(t, -1) if t else -1 for t in node.inputs] if node else []
        )
        # which input slots carry the node's computation type (explain says "follows")
        follows = getattr(node, "follow_inputs", ()) if node else ()
        columns["follows"].append(sorted(follows))
        columns["outputs"].append(
            [tensor_index.get(t, -1) for t in node.outputs if t] if node else []
        )
        columns["planned"].append(int(name in plan.nodes))
        columns["status"].append(status.get(name, 0))
        columns["before"].append(_before(old, name, strings))
        columns["fp8"].append(_fp8(plan, name, strings))
        columns["fp8_before"].append(_fp8_before(old, name, strings))
    return columns


def _fp8(plan: Plan, name: str, strings: Strings) -> list[object] | int:
    """The node's float8 decision (precision, rule, reason) and its operands' scales as
    ``explain`` names them, [label, value, source] (label ``table`` for an embedding table's
    decision); 0 when it has no float8 decision."""
    decision = plan.fp8.get(name)
    if decision is None:
        return 0
    scales = {r.tensor: r for r in plan.scales if name in r.consumers}
    labels = ("table",) if name in plan.fp8_tables() else ("A", "B")  # a lookup reads a table
    operands = [
        [label, value, scales[value].describe() if value in scales else ""]
        for label, value in zip(labels, decision.operands, strict=False)
    ]
    return [strings(decision.precision), strings(decision.rule), strings(decision.reason), operands]


def _fp8_before(old: Plan | None, name: str, strings: Strings) -> list[int] | int:
    """On a diff page: the old plan's float8 decision (precision, rule, reason), 0 when none."""
    decision = old.fp8.get(name) if old else None
    if decision is None:
        return 0
    return [strings(decision.precision), strings(decision.rule), strings(decision.reason)]


def _before(old: Plan | None, name: str, strings: Strings) -> list[int] | int:
    """On a diff page: the old plan's precision, rule and reason (0 when it has none)."""
    decision: NodeDecision | None = old.nodes.get(name) if old else None
    if decision is None:
        return 0
    return [strings(decision.precision), strings(decision.rule), strings(decision.reason)]


def _tensors(
    graph: OpGraph, names: list[str], node_index: dict[str, int], strings: Strings
) -> dict[str, list[object]]:
    columns: dict[str, list[object]] = {
        "name": list(names),
        "dtype": [],
        "producer": [],
        "flags": [],
    }
    for name in names:
        info = graph.tensors[name]
        columns["dtype"].append(strings(info.dtype))
        columns["producer"].append(node_index.get(info.producer, -1) if info.producer else -1)
        flags = GRAPH_INPUT * info.is_graph_input + GRAPH_OUTPUT * info.is_graph_output
        if info.producer is None and not info.is_graph_input:
            flags |= STORED
        columns["flags"].append(flags)
    return columns


def _group_views(
    per_group: dict[str, View],
    node_index: dict[str, int],
    group_index: dict[str, int],
    tensor_index: dict[str, int],
) -> dict[str, object]:
    """A group's views as JSON; the "compute" view is 0 where it is the "all" view."""
    out = {
        variant: _view_json(view, node_index, group_index, tensor_index)
        for variant, view in per_group.items()
    }
    if out.get("compute") == out["all"]:
        out["compute"] = 0
    return out


def _view_json(
    view: View,
    node_index: dict[str, int],
    group_index: dict[str, int],
    tensor_index: dict[str, int],
) -> object:
    refs = {"n": node_index, "g": group_index, "i": tensor_index, "o": tensor_index}
    layout = view.layout
    return {
        "items": [
            [KINDS[kind], refs[kind][ref], round(x), round(y)]
            for (kind, ref), x, y in zip(view.items, layout.x, layout.y, strict=True)
        ],
        "edges": [
            [
                edge.source,
                edge.target,
                [tensor_index[t] for t in edge.tensors],
                edge.casts,
                [round(v) for point in route for v in point],
            ]
            for edge, route in zip(view.edges, layout.routes, strict=True)
        ],
        "w": round(layout.width),
        "h": round(layout.height),
        "crossings": layout.crossings,
    }


def _diff_summary(source: PageInput) -> dict[str, object] | None:
    if source.diff is None:
        return None
    diff = source.diff
    return {
        "old": diff.old_label,
        "new": diff.new_label,
        "dtype": list(diff.dtype) if diff.dtype else None,
        "changed": diff.changed_nodes(),
        "casts_added": len(diff.casts_added),
        "casts_removed": len(diff.casts_removed),
        "summary": {k: [a, b] for k, (a, b) in diff.summary.items()},
    }
