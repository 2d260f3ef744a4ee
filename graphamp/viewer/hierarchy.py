"""Groups for the viewer: the module hierarchy a node's name carries, folded into a tree.

PyTorch's exporters name nodes after the module that made them: the ONNX exporter writes
``/model/layers.3/self_attn/MatMul`` and graphamp's FX reader ``layers.3.self_attn/linear``.
Both read here as the same path: ``layers`` > ``layers.3`` > ``self_attn``, so that twelve
layers are twelve children of one ``layers`` group. A group with more children than one view
can show is split into consecutive parts, so no view ever holds more than
:data:`MAX_CHILDREN` boxes, whatever the names look like.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from graphamp.core.graph import OpGraph
from graphamp.plans.plan import Plan

ROOT = ""
MAX_CHILDREN = 80  # boxes one view may hold before its children are split into parts
SEPARATOR = "/"


def scope_path(name: str) -> tuple[str, ...]:
    """The group path of node ``name``: its module path, a numbered module level being a child
    of the level before it (``layers.3`` under ``layers``). A name without ``/`` has none."""
    parts = [part for part in name.split("/") if part]
    if len(parts) < 2:
        return ()
    segments: list[str] = []
    for part in parts[:-1]:
        for token in part.split("."):
            if not token:
                continue
            if token.isdigit() and segments:
                # "layers.3": a level of its own below "layers", named in full so that the
                # breadcrumbs read "layers > layers.3", not "layers > 3"
                segments.append(f"{segments[-1]}.{token}")
            else:
                segments.append(token)
    return tuple(segments)


def node_path(name: str, scope: str = "") -> tuple[str, ...]:
    """The group path of a node: from its name, or where the name carries none (the dynamo
    exporter's ``node_MatMul_3``) from the module path a reader put in its ``scope``."""
    path = scope_path(name)
    if path or not scope or scope == name:
        return path
    return scope_path(f"{scope}/-")


def leaf_label(name: str) -> str:
    """The last part of a node name, what its box shows under the op type."""
    parts = [part for part in name.split("/") if part]
    return parts[-1] if parts else name


@dataclass
class Group:
    """One folder of the hierarchy: the nodes directly in it and its child groups, in the
    graph's (topological) order."""

    id: str
    label: str
    parent: str | None
    first: int  # index of its first node in graph order: how siblings are ordered
    nodes: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    part: bool = False  # made by splitting a group with too many children

    @property
    def depth(self) -> int:
        return 0 if not self.id else self.id.count(SEPARATOR) + 1


@dataclass
class Hierarchy:
    groups: dict[str, Group]
    group_of: dict[str, str]  # node name -> the group holding it directly
    # node name -> what its box says under the op: its name below its group's path
    labels: dict[str, str] = field(default_factory=dict)

    def chain(self, group: str) -> list[str]:
        """The groups from the root down to ``group``, both included."""
        out = [group]
        while (parent := self.groups[out[-1]].parent) is not None:
            out.append(parent)
        return out[::-1]

    def subtree_nodes(self, group: str) -> Iterable[str]:
        stack = [group]
        while stack:
            current = self.groups[stack.pop()]
            yield from current.nodes
            stack.extend(current.children)


def build_hierarchy(
    names: list[str],
    max_children: int = MAX_CHILDREN,
    paths: dict[str, tuple[str, ...]] | None = None,
) -> Hierarchy:
    """Fold node ``names`` (in graph order) into groups by their module paths (``paths``, by
    default read from the names)."""
    paths = paths or {}
    groups: dict[str, Group] = {ROOT: Group(ROOT, "model", None, 0)}
    group_of: dict[str, str] = {}
    for index, name in enumerate(names):
        parent = ROOT
        for segment in paths.get(name) or scope_path(name):
            gid = f"{parent}{SEPARATOR}{segment}" if parent else segment
            if gid not in groups:
                groups[gid] = Group(gid, segment, parent, index)
                groups[parent].children.append(gid)
            parent = gid
        groups[parent].nodes.append(name)
        group_of[name] = parent
    hierarchy = Hierarchy(groups, group_of)
    _dissolve_single_nodes(hierarchy)
    for name, gid in group_of.items():
        depth = sum(1 for part in gid.split(SEPARATOR) if part) if gid else 0
        path = paths.get(name) or scope_path(name)
        hierarchy.labels[name] = SEPARATOR.join((*path[depth:], leaf_label(name)))
    order = {name: index for index, name in enumerate(names)}
    for gid in list(groups):
        _split(hierarchy, gid, order, max_children)
    return hierarchy


def _dissolve_single_nodes(hierarchy: Hierarchy) -> None:
    """A group holding one node in all is no group worth opening: its node is drawn in the
    nearest group above that holds more (its label keeps the path: ``norm1/LayerNorm``)."""
    groups = hierarchy.groups
    size = dict.fromkeys(groups, 0)
    for gid in hierarchy.group_of.values():
        for above in hierarchy.chain(gid):
            size[above] += 1
    for gid in sorted(groups, key=lambda g: -groups[g].depth):
        group = groups[gid]
        if group.parent is None or size[gid] > 1:
            continue
        parent = groups[group.parent]
        at = parent.children.index(gid)
        parent.children[at : at + 1] = group.children
        for child in group.children:
            groups[child].parent = group.parent
        parent.nodes += group.nodes
        for name in group.nodes:
            hierarchy.group_of[name] = group.parent
        del groups[gid]


def _split(hierarchy: Hierarchy, gid: str, order: dict[str, int], limit: int) -> None:
    """Split a group whose nodes and child groups together pass ``limit`` into consecutive
    parts (in graph order) of at most ``limit`` each, recursively."""
    group = hierarchy.groups[gid]
    members: list[tuple[int, str, bool]] = [(order[n], n, False) for n in group.nodes]
    members += [(hierarchy.groups[c].first, c, True) for c in group.children]
    if len(members) <= limit:
        return
    members.sort()
    parts = -(-len(members) // limit)
    size = -(-len(members) // parts)
    group.nodes, group.children = [], []
    for number in range(parts):
        chunk = members[number * size : (number + 1) * size]
        pid = f"{gid}{SEPARATOR}#{number + 1}" if gid else f"#{number + 1}"
        label = f"{_member_label(hierarchy, chunk[0])} … {_member_label(hierarchy, chunk[-1])}"
        part = Group(pid, label, gid, chunk[0][0], part=True)
        hierarchy.groups[pid] = part
        group.children.append(pid)
        for _, member, is_group in chunk:
            if is_group:
                part.children.append(member)
                hierarchy.groups[member].parent = pid
            else:
                part.nodes.append(member)
                hierarchy.group_of[member] = pid
        _split(hierarchy, pid, order, limit)


def _member_label(hierarchy: Hierarchy, member: tuple[int, str, bool]) -> str:
    _, name, is_group = member
    return hierarchy.groups[name].label if is_group else leaf_label(name)


def _kind(node: object) -> str:
    kind = getattr(node, "kind", "")
    return str(getattr(kind, "value", kind))


def plumbing(plan: Plan, graph: OpGraph) -> set[str]:
    """Nodes with no float math to review: constants, shape plumbing (precision ``none``, Casts
    already in the model excepted: they sit on data paths), and whatever computes only from
    stored values and such nodes (an Identity of a weight, a mask built from constants)."""
    hidden: set[str] = set()
    for node in graph.nodes.values():
        kind = _kind(node)
        decision = plan.nodes.get(node.name)
        if kind == "constant" or (
            decision is not None and decision.precision == "none" and kind != "cast"
        ):
            hidden.add(node.name)
            continue
        sources = [t for t in node.inputs if t]
        if all(_is_stored(graph, t, hidden) for t in sources):
            hidden.add(node.name)
    return hidden


def _is_stored(graph: OpGraph, tensor: str, hidden: set[str]) -> bool:
    info = graph.tensors.get(tensor)
    if info is None:
        return False
    if info.producer is None:
        return not info.is_graph_input
    return info.producer in hidden
