"""An eager CPU step's optimizer tail reordered parameter by parameter, in chunks that fit in a
cache.

A traced step computes each optimizer formula over all parameters before the next one
(:func:`graphamp.fx.training.optim.update` writes them op by op, as torch.optim's foreach
path does, so that :mod:`graphamp.fx.training.foreach` can call each run as one foreach op).
On a GPU that order is the fast one: a foreach op is one multi-tensor kernel. On a CPU a
foreach op runs the per-tensor kernel once per tensor, and op by op over a model's parameters
means every formula streams all parameters, gradients and optimizer state through memory
again, and every temporary (Adam's square roots and step sizes) of every parameter is alive
at once: on BERT-base's AdamW tail that order took about three times as long as the same ops
run one parameter after another, which is the order torch.optim's single-tensor path (a CPU's
default) runs in. :func:`by_parameter` reorders the nodes after the finite check so that each
chunk of parameters runs its whole update before the next chunk starts: a parameter whose
update touches more than :data:`CHUNK_BYTES` is a chunk of its own (its ops then run one by
one, in cache), smaller ones share a chunk up to that size, whose runs the foreach pass still
calls as one foreach op each (biases and norm weights: many tensors, few bytes). For
``torch.compile`` :func:`traced_order` puts the traced order back, as the eager step's other
passes are undone (:func:`graphamp.fx.training.eager.for_compile`).

The reorder changes no value: each op keeps every input it had, and each op that writes into
a tensor keeps its place against every other op that reads or writes the same memory, so the
same ops compute the same bits, only in another order. What it may move:

* the tail: the nodes after the step's finite check (the last one), where the optimizer's
  updates are; nothing before it moves;
* a chunk: the tail's nodes joined by the tensors (not 0-d) they read and write, up to the
  size; a 0-d node (a step count, a bias correction, the learning rate) belongs to no chunk and
  runs as soon as its inputs are ready;
* a call that is not an aten op (the step guard's choice on the host) keeps its place against
  every node of the tail.
"""

from __future__ import annotations

import heapq
import operator
from collections import defaultdict
from collections.abc import Callable

import torch
from torch import fx

from graphamp.errors import InternalError
from graphamp.fx.dialect.lowering import any_non_finite, unscale_and_check
from graphamp.fx.dialect.ops import returns_alias, written_arguments
from graphamp.fx.training.in_place import recompiled, update_unless

# A chunk's bytes (the tensors its nodes write and read): about a core's L2 cache, so a small
# parameter's update (a bias, a norm's weight) shares a foreach call with its neighbours and a
# large one runs alone, its tensors read once for all its formulas.
CHUNK_BYTES = 1 << 20
_CHECKS = (any_non_finite, unscale_and_check)
_TRACED_POSITION = "graphamp_traced_position"  # on a moved node: where the trace had it


def by_parameter(module: fx.GraphModule, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Reorder ``module``'s tail (see the module docstring) when every tensor in it lives on
    a CPU; how many chunks its nodes were put in (0: nothing moved)."""
    graph = module.graph
    nodes = list(graph.nodes)
    checks = [index for index, node in enumerate(nodes) if node.target in _CHECKS]
    if not checks:
        return 0
    boundary = nodes[checks[-1]]
    tail = [node for node in nodes[checks[-1] + 1 :] if node.op != "output"]
    if not tail or not all(_on_cpu(node) for node in tail):
        return 0
    order = {node: index for index, node in enumerate(nodes)}
    chunk_of = _chunks(tail, chunk_bytes)
    if len(set(chunk_of.values())) < 2:
        return 0
    after = _dependencies(tail, order)
    scheduled = _schedule(tail, after, lambda node: (chunk_of.get(node, -1), order[node]))
    if scheduled == tail:
        return 0
    for node in tail:
        node.meta[_TRACED_POSITION] = order[node]
    _place_after(boundary, scheduled)
    return recompiled(module, len(set(chunk_of.values())))


def traced_order(module: fx.GraphModule) -> int:
    """Undo :func:`by_parameter`: the tail's nodes back in the order the trace had them
    (``torch.compile`` gets the traced graph; inductor orders and fuses its own kernels). A
    node :func:`~graphamp.fx.training.foreach.ungrouped` made again carries its member's
    position. Returns how many nodes it placed (0: nothing had moved)."""
    graph = module.graph
    nodes = list(graph.nodes)
    checks = [index for index, node in enumerate(nodes) if node.target in _CHECKS]
    if not checks:
        return 0
    tail = [node for node in nodes[checks[-1] + 1 :] if node.op != "output"]
    if not tail or any(_TRACED_POSITION not in node.meta for node in tail):
        return 0
    traced = sorted(tail, key=lambda node: node.meta.pop(_TRACED_POSITION))
    if traced == tail:
        return 0
    _place_after(nodes[checks[-1]], traced)
    return recompiled(module, len(traced))


def _place_after(anchor: fx.Node, ordered: list[fx.Node]) -> None:
    for node in ordered:
        anchor.append(node)
        anchor = node


def _on_cpu(node: fx.Node) -> bool:
    values = node.meta.get("val")
    values = values if isinstance(values, list | tuple) else [values]
    return all(v.device.type == "cpu" for v in values if isinstance(v, torch.Tensor))


def _tensor(node: object) -> torch.Tensor | None:
    """The tensor ``node`` holds when it is a node of one tensor with a dimension."""
    if not isinstance(node, fx.Node):
        return None
    value = node.meta.get("val")
    return value if isinstance(value, torch.Tensor) and value.ndim > 0 else None


def _chunks(tail: list[fx.Node], chunk_bytes: int) -> dict[fx.Node, int]:
    """Each tail node of a tensor with a dimension -> its chunk: the nodes joined by the
    tensors they read (union-find), the groups in the order they first appear, packed into
    chunks of at most ``chunk_bytes`` (a larger group alone)."""
    parent: dict[fx.Node, fx.Node] = {}

    def root(node: fx.Node) -> fx.Node:
        while parent.setdefault(node, node) is not node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    members = [node for node in tail if _tensor(node) is not None and _movable(node)]
    for node in members:
        for source in node.all_input_nodes:
            if _tensor(source) is not None:
                parent[root(source)] = root(node)
    groups: dict[fx.Node, list[fx.Node]] = defaultdict(list)
    for node in members:
        groups[root(node)].append(node)
    sizes: dict[fx.Node, int] = defaultdict(int)
    for node in {n for n in parent if _tensor(n) is not None}:
        tensor = _tensor(node)
        assert tensor is not None
        sizes[root(node)] += tensor.numel() * tensor.element_size()
    chunk_of: dict[fx.Node, int] = {}
    chunk, filled = 0, 0
    for group_root, group in groups.items():  # (first appearance: dicts keep insertion order)
        size = sizes[group_root]
        if filled and filled + size > chunk_bytes:
            chunk, filled = chunk + 1, 0
        filled += size
        chunk_of.update((node, chunk) for node in group)
    return chunk_of


def _movable(node: fx.Node) -> bool:
    """An aten op, a guarded update or a piece of a result: calls whose reads and writes the
    schema (or :func:`update_unless`'s signature) names."""
    return node.op == "call_function" and (
        isinstance(node.target, torch._ops.OpOverload)
        or node.target in (update_unless, operator.getitem)
    )


def _written(node: fx.Node) -> list[fx.Node]:
    """The nodes whose memory ``node`` writes into."""
    if node.target is update_unless:
        return [node.args[3]] if isinstance(node.args[3], fx.Node) else []
    if not isinstance(node.target, torch._ops.OpOverload):
        return []
    return written_arguments(node)


def _memory(node: fx.Node) -> fx.Node:
    """The node whose memory ``node``'s value is: through ops returning a view of (or the
    same memory as) their first input."""
    while node.op == "call_function" and _aliases_input(node):
        base = node.args[3 if node.target is update_unless else 0]
        if not isinstance(base, fx.Node):
            break
        node = base
    return node


def _aliases_input(node: fx.Node) -> bool:
    if node.target is operator.getitem:
        return True
    if node.target is update_unless:
        return True  # (returns its target, written in place)
    if not isinstance(node.target, torch._ops.OpOverload):
        return False
    return returns_alias(node)


def _dependencies(tail: list[fx.Node], order: dict[fx.Node, int]) -> dict[fx.Node, set[fx.Node]]:
    """For each tail node, the tail nodes that must run before it: its inputs; for an op that
    writes into some memory, every reader of that memory (through any view) on the side it
    was on; and for a call that is not an aten op, every tail node before it (and it before
    every tail node after it)."""
    in_tail = set(tail)
    before: dict[fx.Node, set[fx.Node]] = {node: set() for node in tail}
    for node in tail:
        before[node] |= {source for source in node.all_input_nodes if source in in_tail}
    readers: dict[fx.Node, set[fx.Node]] = defaultdict(set)
    for node in tail:
        for source in node.all_input_nodes:
            readers[_memory(source)].add(node)
    for writer in tail:
        for memory in {_memory(target) for target in _written(writer)}:
            for reader in readers[memory] - {writer}:
                first, second = sorted((reader, writer), key=order.__getitem__)
                before[second].add(first)
    for index, node in enumerate(tail):
        if not _movable(node):
            before[node] |= set(tail[:index])
            for later in tail[index + 1 :]:
                before[later].add(node)
    return before


def _schedule(
    tail: list[fx.Node],
    before: dict[fx.Node, set[fx.Node]],
    key: Callable[[fx.Node], tuple[int, int]],
) -> list[fx.Node]:
    """A topological order of ``tail`` under ``before``, taking the ready node of the
    smallest ``key`` first."""
    waiting = {node: len(sources) for node, sources in before.items()}
    then: dict[fx.Node, list[fx.Node]] = defaultdict(list)
    for node, sources in before.items():
        for source in sources:
            then[source].append(node)
    ready = [(key(node), node.name) for node in tail if not waiting[node]]
    heapq.heapify(ready)
    by_name = {node.name: node for node in tail}
    scheduled: list[fx.Node] = []
    while ready:
        node = by_name[heapq.heappop(ready)[1]]
        scheduled.append(node)
        for later in then[node]:
            waiting[later] -= 1
            if not waiting[later]:
                heapq.heappush(ready, (key(later), later.name))
    if len(scheduled) != len(tail):
        raise InternalError("the optimizer tail's dependencies hold a cycle")
    return scheduled
