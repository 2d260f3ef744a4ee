"""Plans for people: a compact text table, the chain of reasons behind one node, and a
self-contained HTML page with the graph drawn and coloured by precision."""

from __future__ import annotations

from collections import defaultdict

from graphamp.errors import GraphampError
from graphamp.graph import OpGraph
from graphamp.plan import Plan
from graphamp.records import NodeDecision

PRECISION_ORDER = ("float16", "bfloat16", "float32", "float64", "none")


def text_table(plan: Plan) -> str:
    """Nodes grouped by precision, one line each: name, op, rule, reason (via neighbour)."""
    groups: dict[str, list[tuple[str, NodeDecision]]] = defaultdict(list)
    for name, decision in sorted(plan.nodes.items()):
        groups[decision.precision].append((name, decision))
    order = [p for p in PRECISION_ORDER if p in groups] + sorted(set(groups) - set(PRECISION_ORDER))
    width = max((len(name) for name in plan.nodes), default=4)
    op_width = max((len(d.op) for d in plan.nodes.values()), default=2)
    summary = plan.summary()
    lines = [
        f"plan for {plan.model or 'model'} ({plan.dtype}): "
        + ", ".join(f"{count} {precision}" for precision, count in summary["nodes"].items())  # type: ignore[union-attr]
        + f"; {_count(summary['casts_inserted'], 'cast')}; MatMul/Gemm/Conv low "
        f"{summary['matrix_ops_low']}/{summary['matrix_ops']}"
    ]
    for precision in order:
        lines += ["", f"{precision} ({len(groups[precision])})"]
        for name, decision in groups[precision]:
            via = f" [via {decision.via}]" if decision.via else ""
            lines.append(
                f"  {name:<{width}}  {decision.op:<{op_width}}  {decision.rule:<12} "
                f"{decision.reason}{via}"
            )
    if plan.all_casts():
        lines += ["", f"casts ({len(plan.all_casts())})"]
        for cast in sorted(plan.all_casts(), key=lambda c: c.output):
            readers = ", ".join(cast.consumers) or cast.purpose
            lines.append(f"  {cast.tensor}: {cast.src} -> {cast.dst}  (for {readers})")
    return "\n".join(lines) + "\n"


def explain(plan: Plan, node: str, graph: OpGraph | None = None) -> str:
    """The chain of reasons for ``node``: its decision, then each neighbour its colour came
    through, down to the rule that started it; then how its inputs reach it. A node of the
    model that a rewrite replaced is explained by the rewrite."""
    rewrites = {r.node: r for r in plan.rewrites}
    replaced_by = {old: r for r in plan.rewrites for old in r.replaces}
    if node not in plan.nodes and node in replaced_by:
        rewrite = replaced_by[node]
        return (
            f"{node}: replaced by {rewrite.node} ({rewrite.op}), rule {rewrite.rule}: "
            f"{rewrite.reason}\n" + explain(plan, rewrite.node, graph)
        )
    if node not in plan.nodes:
        import difflib

        close = difflib.get_close_matches(node, plan.nodes, n=3)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise GraphampError(f"no node named {node!r} in the plan{hint}")
    lines, seen, current = [], set(), node
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
            how = f"; cast {cast.src} -> {cast.dst}" if cast else ""
            follows = (
                "follows the node's precision"
                if slot in op_node.follow_inputs
                else "keeps its type"
            )
            lines.append(f"  input {slot} {tensor!r} {source}, {follows}{how}")
    return "\n".join(lines) + "\n"


def _count(number: object, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"
