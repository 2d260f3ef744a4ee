"""Stored values in the casts pass: converted where their readers want another type, and the
weights kept in their type because their values would overflow the target.

Used by :mod:`casts`; helpers, not a pass.
"""

from __future__ import annotations

from collections import defaultdict

from graphamp.core.dtypes import itemsize
from graphamp.core.graph import OpGraph
from graphamp.core.names import Names
from graphamp.core.vocab import Rule
from graphamp.passes.classify import stored_float32_inputs
from graphamp.passes.weights import WeightRanges
from graphamp.plans.edits import EditScript
from graphamp.plans.records import NodeDecision, WeightRecord


def plan_weights(
    graph: OpGraph,
    weight_readers: dict[tuple[str, str], list[tuple[str, int]]],
    has: dict[str, str],
    edits: EditScript,
    names: Names,
    weights: WeightRanges,
) -> None:
    """Convert stored values: in place if every reader wants ``dtype``, else as a copy."""
    for (name, want), slots in weight_readers.items():
        tensor = graph.tensors[name]
        in_place = len(slots) == len(graph.consumers(name)) and not tensor.is_graph_output
        stats = weights.stats(name, want)
        elements = stats.elements
        stored_as = name if in_place else names.derived(name, f"__{want}")
        edits.weights.append(
            WeightRecord(
                name=name,
                src=has[name],
                dst=want,
                stored_as=stored_as,
                in_place=in_place,
                elements=elements,
                bytes_before=elements * itemsize(has[name]),
                bytes_after=elements * itemsize(want),
                flushed_to_zero=stats.flushed,
                consumers=sorted({n for n, _ in slots}),
                at_limit=stats.at_limit,
            )
        )
        if in_place:
            edits.retype[name] = want
        for slot_key in slots:
            if not in_place:
                edits.rewire[slot_key] = stored_as


def kept_weights(
    graph: OpGraph, decisions: dict[str, NodeDecision], weights: WeightRanges
) -> list[WeightRecord]:
    """The stored weights whose values overflow the target: classify kept their readers
    float32 (rule ``weight_range``), and the plan says which weight and how many values."""
    readers: dict[str, list[str]] = defaultdict(list)
    # (from the decisions, not a walk of the graph: the result is sorted, any order will do)
    kept_readers = [name for name, d in decisions.items() if d.rule is Rule.WEIGHT_RANGE]
    for node_name in kept_readers:
        if node_name in graph.nodes:
            for name in stored_float32_inputs(graph.nodes[node_name], weights):
                readers[name].append(node_name)
    kept = []
    for name, nodes in sorted(readers.items()):
        stats = weights.stats(name)
        if stats.beyond:
            elements = stats.elements
            kept.append(
                WeightRecord(
                    name=name,
                    src="float32",
                    dst="float32",
                    stored_as=name,
                    in_place=True,
                    elements=elements,
                    bytes_before=elements * 4,
                    bytes_after=elements * 4,
                    flushed_to_zero=0,
                    consumers=sorted(nodes),
                    out_of_range=stats.beyond,
                )
            )
    return kept
