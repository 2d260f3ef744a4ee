"""Plans for people: a compact text table, the chain of reasons behind one node, and a
self-contained HTML page with the graph drawn and coloured by precision."""

from __future__ import annotations

from collections import defaultdict

from graphamp.core.graph import OpGraph
from graphamp.core.text import printable_lines
from graphamp.errors import GraphampError
from graphamp.plans.plan import Plan
from graphamp.plans.records import BOUNDARY, CastRecord, NodeDecision

PRECISION_ORDER = ("float16", "bfloat16", "float32", "float64", "none")


def text_table(plan: Plan) -> str:
    """Nodes grouped by precision, one line each: name, op, rule, reason (via neighbour).
    Every text here ends in :func:`printable_lines`: names and reasons come from the model."""
    groups: dict[str, list[tuple[str, NodeDecision]]] = defaultdict(list)
    for name, decision in sorted(plan.nodes.items()):
        groups[decision.precision].append((name, decision))
    order = [p for p in PRECISION_ORDER if p in groups] + sorted(set(groups) - set(PRECISION_ORDER))
    labels = {  # the module a node came from, where its name does not say (dynamo exports)
        name: f"{name} ({d.module})" if d.module else name for name, d in plan.nodes.items()
    }
    width = max((len(label) for label in labels.values()), default=4)
    op_width = max((len(d.op) for d in plan.nodes.values()), default=2)
    summary = plan.summary()
    lines = [
        f"plan for {plan.model or 'model'} ({plan.dtype}): "
        + ", ".join(f"{count} {precision}" for precision, count in plan.counts().items())
        + f"; {_count(summary['casts_inserted'], 'cast')}; MatMul/Gemm/Conv low "
        f"{summary['matrix_ops_low']}/{summary['matrix_ops']}"
    ]
    for precision in order:
        lines += ["", f"{precision} ({len(groups[precision])})"]
        for name, decision in groups[precision]:
            via = f" [via {decision.via}]" if decision.via else ""
            lines.append(
                f"  {labels[name]:<{width}}  {decision.op:<{op_width}}  {decision.rule:<12} "
                f"{decision.reason}{via}"
            )
    if plan.fp8_settings is not None:
        tables = plan.fp8_tables()
        lines += [
            "",
            f"float8 ({summary['matrix_ops_fp8']} of {len(plan.fp8) - len(tables)} matrix ops "
            "decided low"
            + (
                f"; {summary.get('tables_8bit')} of {len(tables)} embedding tables 8-bit)"
                if tables
                else ")"
            )
            + (
                f"; {summary['weights_int8']} kept ones' weights int8"
                if "weights_int8" in summary
                else ""
            ),
        ]
        for name, fp8_decision in sorted(plan.fp8.items()):
            lines.append(
                f"  {labels.get(name, name):<{width}}  {fp8_decision.rule:<12} "
                f"{fp8_decision.reason}"
            )
    if plan.all_casts():
        lines += ["", f"casts ({len(plan.all_casts())}, {summary['cast_bytes']} bytes per run)"]
        for cast in sorted(plan.all_casts(), key=lambda c: c.output):
            readers = ", ".join(cast.consumers) or cast.purpose
            lines.append(
                f"  {cast.tensor}: {cast.src} -> {cast.dst}{_bytes(cast)}  (for {readers})"
            )
    return printable_lines(lines)


def explain(plan: Plan, node: str, graph: OpGraph | None = None) -> str:
    """The chain of reasons for ``node``: its decision, then each neighbour its colour came
    through, down to the rule that started it; then how its inputs reach it. A node of the
    model that a rewrite replaced is explained by the rewrite."""
    rewrites = {r.node: r for r in plan.rewrites}
    replaced_by = {old: r for r in plan.rewrites for old in r.replaces}
    if node not in plan.nodes and node in replaced_by:
        rewrite = replaced_by[node]
        replaced = (
            f"{node}: replaced by {rewrite.node} ({rewrite.op}), rule {rewrite.rule}: "
            f"{rewrite.reason}"
        )
        return printable_lines([replaced]) + explain(plan, rewrite.node, graph)
    cast = next((c for c in plan.all_casts() if node in (c.output, c.tensor)), None)
    if node not in plan.nodes and cast is not None:
        return explain_cast(plan, cast, graph)
    if node not in plan.nodes:
        import difflib

        of_type = sorted(name for name, d in plan.nodes.items() if d.op == node)
        if of_type:  # an op type, not a node name: name the nodes of that type
            shown = ", ".join(repr(name) for name in of_type[:5])
            more = f" and {len(of_type) - 5} more" if len(of_type) > 5 else ""
            raise GraphampError(
                f"no node named {node!r} in the plan; {node} is an op type: explain one of "
                f"its {len(of_type)} node(s), e.g. {shown}{more}"
            )
        close = difflib.get_close_matches(node, plan.nodes, n=3)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise GraphampError(f"no node named {node!r} in the plan{hint}")
    lines: list[str] = []
    seen: set[str] = set()
    current: str | None = node
    depth = 0
    while current is not None and current not in seen:
        seen.add(current)
        decision = plan.nodes[current]
        arrow = "" if depth == 0 else "  " * depth + "<- "
        lines.append(
            f"{arrow}{current} ({decision.op}): {decision.precision}, "
            f"rule {decision.rule}: {decision.reason}"
        )
        current, depth = decision.via, depth + 1
    lines += fp8_lines(plan, node)
    if node in rewrites:
        rewrite = rewrites[node]
        lines.append(
            f"  rewrite {rewrite.rule}: {rewrite.reason}; it replaces {', '.join(rewrite.replaces)}"
        )
    if graph is not None and node in graph.nodes:
        op_node = graph.nodes[node]
        for slot, tensor in enumerate(op_node.inputs):
            if not tensor:
                continue
            producer = graph.tensors[tensor].producer if tensor in graph.tensors else None
            known = producer in plan.nodes
            source = (
                f"from {producer} ({plan.nodes[producer].precision})"
                if producer and known
                else f"from {producer}"
                if producer
                else "graph input"
                if graph.tensors[tensor].is_graph_input
                else "stored value"
            )
            cast = next((c for c in plan.casts if c.tensor == tensor and node in c.consumers), None)
            how = (
                f"; cast {cast.src} -> {cast.dst}{_bytes(cast)} as {cast.output!r}" if cast else ""
            )
            follows = (
                "follows the node's precision"
                if slot in op_node.follow_inputs
                else "keeps its type"
            )
            lines.append(f"  input {slot} {tensor!r} {source}, {follows}{how}")
    return printable_lines(lines)


def fp8_lines(plan: Plan, node: str) -> list[str]:
    """``node``'s float8 decision and, for each operand, its scale's format, granularity and
    source (none where the node keeps the low type)."""
    decision = plan.fp8.get(node)
    if decision is None:
        return []
    lines = [f"  float8: {decision.precision}, rule {decision.rule}: {decision.reason}"]
    scales = {record.tensor: record for record in plan.scales if node in record.consumers}
    if node in plan.fp8_tables():
        for value in decision.operands:
            record = scales.get(value)
            stored = record.describe() if record is not None else f"kept {plan.dtype}"
            lines.append(f"  table {value!r}: {stored}")
        return lines
    for label, value in zip(("A", "B"), decision.operands, strict=False):
        record = scales.get(value)
        source = record.describe() if record is not None else f"not quantised ({plan.dtype})"
        lines.append(f"  operand {label} {value!r}: {source}")
    return lines


def _count(number: object, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def explain_cast(plan: Plan, cast: CastRecord, graph: OpGraph | None = None) -> str:
    """Why a Cast sits where it does: the precisions on either side of it, and (with the
    graph) the bytes it would move one op earlier or later, where that op could have gone
    the other way (an infer or clear op)."""
    lines = [
        f"Cast {cast.output!r}: {cast.tensor!r} {cast.src} -> {cast.dst}{_bytes(cast)}, "
        f"{cast.purpose}"
    ]
    if graph is None or cast.tensor not in graph.tensors:
        readers = ", ".join(cast.consumers) or "the graph output"
        return printable_lines([*lines, f"  read by {readers}"])
    producer = graph.tensors[cast.tensor].producer
    if producer in plan.nodes:
        lines.append(f"  {cast.tensor!r} comes from {_side(plan, producer)}")
    else:
        lines.append(f"  {cast.tensor!r} is a graph input in {cast.src}")
    lines += [f"  read by {_side(plan, reader)}" for reader in cast.consumers]
    moves = []
    if producer in plan.nodes and plan.nodes[producer].rule in _MOVABLE:
        before = _cast_total(
            graph, graph.nodes[producer].inputs, graph.nodes[producer].follow_inputs, cast
        )
        if before is not None:
            moves.append(
                f"before {producer} (its inputs cast, {producer} in {cast.dst}): {before} bytes"
            )
    for reader in cast.consumers:
        node = graph.nodes.get(reader)
        if node is None or plan.nodes[reader].rule not in _MOVABLE:
            continue
        after = _cast_total(graph, node.outputs, node.follow_outputs, cast)
        if after is not None:
            moves.append(
                f"after {reader} (its outputs cast, {reader} in {cast.src}): {after} bytes"
            )
    if moves:
        lines.append("  one op away it would move: " + "; ".join(moves))
    elif cast.purpose == BOUNDARY:
        lines.append(
            "  neither side can move: both are fixed by their rules (an infer or clear op "
            "beside it would show what moving the Cast past it costs)"
        )
    return printable_lines(lines)


_MOVABLE = ("infer", "clear")


def _side(plan: Plan, node: str) -> str:
    decision = plan.nodes[node]
    return f"{node} ({decision.op}): {decision.precision}, rule {decision.rule}: {decision.reason}"


def _cast_total(
    graph: OpGraph, values: list[str], slots: frozenset[int], cast: CastRecord
) -> int | None:
    """The bytes Casts of ``values`` at ``slots`` (float values only) would move, as
    ``cast`` does; None when a shape is unknown."""
    from graphamp.core.dtypes import cast_bytes

    total = 0
    for slot in sorted(slots):
        name = values[slot] if slot < len(values) else ""
        tensor = graph.tensors.get(name)
        if tensor is None or tensor.dtype != "float32" or tensor.is_constant:
            continue
        moved = cast_bytes(tensor.shape, cast.src, cast.dst)
        if moved is None:
            return None
        total += moved
    return total


def _bytes(cast: CastRecord) -> str:
    return f" ({cast.bytes} bytes per run)" if cast.bytes is not None else ""
