"""kept: a model that already computes in a low type keeps its float32 ops float32.

A converted model holds its decisions in its types: the ops it computes low and, between
them, the ops it leaves float32 behind its own Casts. Why an op was left float32 is not in the
model: calibration data that overflowed it, a tune run, a deny_names or deny_tensors rule, a
reviewed plan, the cost of a Cast. Deciding such an op again without that knowledge puts it
low (its Casts are now the model's own, and the lists alone would lower it): the overflow the
calibration found comes back. So, in a model where some op already computes in a low type
(classify's ``already_low``):

1. Every op or body boundary that computes float32 and that a later pass could put low (the
   allow, infer, clear and unlisted classes, after the qdq, saturation, range and tuned
   passes) stays float32 with rule ``kept``: a decision of whoever made the model, not a
   region to decide again.
2. An ``allow_names`` rule still lowers a node it names (classify's ``allow_name``, which this
   pass leaves alone): the way to change such a decision. Every other float32 rule (deny lists,
   name and tensor rules, schema, kernels, ranges) keeps its own reason.
3. The reason names the model's own Casts between float32 and the low type that bracket the
   op's float32 region (the float32 ops joined to it through the values their
   computation-type slots share), where there are any.

So ``convert(convert(m, flags), flags)`` writes the bytes ``convert(m, flags)`` wrote,
whatever decided its float32 ops. A model with no low op (a float32 model, one that only
stores its weights low) is decided as always.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from graphamp.core.graph import NodeKind, OpGraph, OpNode
from graphamp.core.vocab import Precision, Rule
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.plans.records import NodeDecision

log = logging.getLogger(__name__)

# The classes a later pass may put low (allow_name aside: the user asks for low).
_LOWERABLE = frozenset({Rule.ALLOW, Rule.INFER, Rule.CLEAR, Rule.UNLISTED})
_NAMED_CASTS = 2  # Casts a reason names


class KeptPass(Pass):
    """Keep float32 the float32 ops of a model that already computes low (module docstring)."""

    name = "kept"
    requires = frozenset({Fact.CLASSIFIED})

    def run(self, context: PassContext) -> PassResult:
        if not context.options.keep_model_decisions:
            return PassResult(modified=False, note="off: the graph's low values are no decision")
        kept = keep_model_decisions(context.graph, context.decisions)
        context.decisions.update(kept)
        return PassResult(modified=False, note=f"{len(kept)} float32 ops the model keeps")


def keep_model_decisions(
    graph: OpGraph, decisions: dict[str, NodeDecision]
) -> dict[str, NodeDecision]:
    """The decisions rule 1 changes (module docstring), by node name."""
    low_types = sorted({str(d.precision) for d in decisions.values() if d.rule is Rule.ALREADY_LOW})
    if not low_types:
        return {}
    candidates = [
        node
        for node in graph
        if node.kind in (NodeKind.OP, NodeKind.BOUNDARY)
        and decisions[node.name].rule in _LOWERABLE
        and node.compute_type == "float32"
    ]
    if not candidates:
        return {}
    regions = Regions(graph, candidates)
    low = "/".join(low_types)
    reasons: dict[str, str] = {}
    kept = {}
    for node in candidates:
        root = regions.find(node.name)
        reason = reasons.get(root)
        if reason is None:
            casts = regions.bracketing_casts(root, set(low_types))
            reason = reasons[root] = _reason(low, casts)
        kept[node.name] = NodeDecision(
            decisions[node.name].op, Precision.FLOAT32, Rule.KEPT, reason
        )
    log.info("kept: %d float32 ops of a model that computes in %s", len(kept), low)
    return kept


def _reason(low: str, casts: list[str]) -> str:
    where = (
        f"float32 between the input model's own Casts to and from {low} "
        f"({', '.join(repr(c) for c in casts[:_NAMED_CASTS])}"
        f"{', ...' if len(casts) > _NAMED_CASTS else ''})"
        if casts
        else f"float32 in an input model that already computes in {low}"
    )
    return f"{where}: a decision the model holds, kept (--allow-name lowers it)"


class Regions:
    """The candidates joined through the values their computation-type slots read or write
    (union-find over nodes and values), and the model's Casts at each region's edge (the
    isolated pass groups the ops decided low by it too)."""

    def __init__(self, graph: OpGraph, nodes: list[OpNode]) -> None:
        self.graph = graph
        self.parent: dict[str, str] = {}
        self.values: dict[str, list[str]] = {}  # a node's computation-type values
        self.members: dict[str, list[str]] | None = None  # a region's values, by its root
        for node in nodes:
            values = [*slot_values(node.inputs, node.follow_inputs)]
            values += slot_values(node.outputs, node.follow_outputs)
            self.values[node.name] = values
            for value in values:
                self._union(node.name, "\0" + value)

    def find(self, key: str) -> str:
        parent = self.parent
        root = key
        while parent.get(root, root) != root:
            root = parent[root]
        while key != root:  # path compression
            parent[key], key = root, parent[key]
        return root

    def _union(self, a: str, b: str) -> None:
        self.parent.setdefault(a, a)
        self.parent.setdefault(b, b)
        first, second = self.find(a), self.find(b)
        if first != second:
            self.parent[max(first, second)] = min(first, second)

    def bracketing_casts(self, root: str, low_types: set[str]) -> list[str]:
        """The model's Casts from a low type that write a value of region ``root``, and those
        to a low type that read one, in graph order."""
        graph = self.graph
        if self.members is None:  # each region's values, gathered once
            self.members = {}
            for name, values in self.values.items():
                self.members.setdefault(self.find(name), []).extend(values)
        found: set[str] = set()
        for value in dict.fromkeys(self.members[root]):
            producer = graph.tensors[value].producer
            if producer is not None and _casts_between(graph, graph.nodes[producer], low_types):
                found.add(producer)
            for reader, _ in graph.consumers(value):
                if _casts_between(graph, graph.nodes[reader], low_types):
                    found.add(reader)
        order = {name: index for index, name in enumerate(graph.nodes)} if found else {}
        return sorted(found, key=order.__getitem__)


def _casts_between(graph: OpGraph, node: OpNode, low_types: set[str]) -> bool:
    """Whether ``node`` is a Cast of the model from a low type or to one."""
    if node.kind is not NodeKind.CAST or not node.inputs or not node.inputs[0]:
        return False
    source = graph.tensors.get(node.inputs[0])
    return node.cast_to in low_types or (source is not None and source.dtype in low_types)


def slot_values(names: list[str], slots: Iterable[int]) -> list[str]:
    """The values at ``slots`` of a node's ``names`` (its inputs or outputs), absent ones left
    out."""
    return [names[slot] for slot in sorted(slots) if slot < len(names) and names[slot]]
