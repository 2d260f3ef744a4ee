"""One view per group: what the viewer draws when a group is open.

A view holds the group's own nodes, its child groups as closed boxes, and ports: one for each
tensor that enters the group from outside and one for each that leaves it (at the top level,
the graph's inputs and outputs). A tensor flowing between two nodes is drawn in the view of
the innermost group holding both, between the boxes that hold each, and in every group on
the way down as an edge to or from a port. Edges between the same two boxes are one edge that
lists its tensors and the casts on them. Each view is laid out once, here, in Python.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from graphamp.core.graph import OpGraph
from graphamp.viewer.hierarchy import ROOT, Hierarchy
from graphamp.viewer.layout import Layout, layered_layout

NODE_SIZE = (156.0, 40.0)
GROUP_SIZE = (208.0, 62.0)
PORT_SIZE = (172.0, 24.0)

Item = tuple[str, str]  # ("g", group id) | ("n", node name) | ("i" | "o", tensor name)


@dataclass
class ViewEdge:
    source: int  # item index
    target: int
    tensors: list[str] = field(default_factory=list)
    casts: list[int] = field(default_factory=list)  # indices into the page's cast list


@dataclass
class View:
    items: list[Item]
    edges: list[ViewEdge]
    layout: Layout


@dataclass
class Flow:
    """One tensor read: from a node or a graph input, to a node or a graph output."""

    source: Item
    target: Item
    tensor: str
    casts: list[int]


def flows(
    graph: OpGraph, visible: set[str], casts_at: dict[tuple[str, str], list[int]]
) -> list[Flow]:
    """Every tensor read between visible nodes (and graph inputs and outputs), in graph order;
    ``casts_at`` maps (tensor, reader) to the casts on that read ("" reads a graph output)."""
    found = []
    for node in graph.nodes.values():
        if node.name not in visible:
            continue
        for tensor in dict.fromkeys(t for t in node.inputs if t):
            info = graph.tensors.get(tensor)
            if info is None:
                continue
            if info.producer is not None:
                if info.producer not in visible:
                    continue
                source: Item = ("n", info.producer)
            elif info.is_graph_input:
                source = ("i", tensor)
            else:
                continue  # a stored value: drawn in the node's panel, not as an edge
            found.append(
                Flow(source, ("n", node.name), tensor, casts_at.get((tensor, node.name), []))
            )
    for tensor, info in graph.tensors.items():
        if info.is_graph_output and info.producer in visible:
            casts = casts_at.get((tensor, ""), [])
            found.append(Flow(("n", info.producer), ("o", tensor), tensor, casts))
    return found


def build_views(
    hierarchy: Hierarchy, order: dict[str, int], visible: set[str], found: Iterable[Flow]
) -> dict[str, View]:
    """The view of every group holding a visible node."""
    members: dict[str, dict[Item, None]] = {}
    for name in order:
        if name not in visible or name not in hierarchy.group_of:
            continue
        chain = hierarchy.chain(hierarchy.group_of[name])
        for depth, group in enumerate(chain):
            below = ("g", chain[depth + 1]) if depth + 1 < len(chain) else ("n", name)
            members.setdefault(group, {})[below] = None
    members.setdefault(ROOT, {})
    pending: dict[str, dict[tuple[Item, Item], tuple[list[str], list[int]]]] = {
        g: {} for g in members
    }

    def add(group: str, source: Item, target: Item, flow: Flow) -> None:
        tensors, casts = pending[group].setdefault((source, target), ([], []))
        if flow.tensor not in tensors:
            tensors.append(flow.tensor)
        casts.extend(c for c in flow.casts if c not in casts)

    for flow in found:
        source_chain = _chain(hierarchy, flow.source)
        target_chain = _chain(hierarchy, flow.target)
        common = 0
        while (
            common + 1 < min(len(source_chain), len(target_chain))
            and source_chain[common + 1] == target_chain[common + 1]
        ):
            common += 1
        top = source_chain[common]
        add(
            top,
            _item(source_chain, common, flow.source),
            _item(target_chain, common, flow.target),
            flow,
        )
        for depth in range(common + 1, len(source_chain)):
            add(
                source_chain[depth],
                _item(source_chain, depth, flow.source),
                ("o", flow.tensor),
                flow,
            )
        for depth in range(common + 1, len(target_chain)):
            add(
                target_chain[depth],
                ("i", flow.tensor),
                _item(target_chain, depth, flow.target),
                flow,
            )
    return {
        group: _view(list(members[group]), pending[group], order, hierarchy) for group in members
    }


def _chain(hierarchy: Hierarchy, item: Item) -> list[str]:
    if item[0] == "n":
        return hierarchy.chain(hierarchy.group_of[item[1]])
    return [ROOT]


def _item(chain: list[str], depth: int, endpoint: Item) -> Item:
    return ("g", chain[depth + 1]) if depth + 1 < len(chain) else endpoint


def _view(
    inner: list[Item],
    links: dict[tuple[Item, Item], tuple[list[str], list[int]]],
    order: dict[str, int],
    hierarchy: Hierarchy,
) -> View:
    items = list(inner)
    ports_in = sorted({s for s, _ in links if s[0] == "i"}, key=lambda p: p[1])
    ports_out = sorted({t for _, t in links if t[0] == "o"}, key=lambda p: p[1])
    items += ports_in + ports_out
    index = {item: i for i, item in enumerate(items)}
    last = len(order) + 1

    def key(item: Item) -> int:
        kind, ref = item
        if kind == "n":
            return order[ref]
        if kind == "g":
            return hierarchy.groups[ref].first
        return -1 if kind == "i" else last

    sizes = [{"n": NODE_SIZE, "g": GROUP_SIZE}.get(kind, PORT_SIZE) for kind, _ in items]
    edges = [
        ViewEdge(index[s], index[t], tensors, casts) for (s, t), (tensors, casts) in links.items()
    ]
    layout = layered_layout(sizes, [key(i) for i in items], [(e.source, e.target) for e in edges])
    return View(items, edges, layout)
