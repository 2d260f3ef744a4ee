"""Plans for people: a compact text table, the chain of reasons behind one node, and a
self-contained HTML page with the graph drawn and coloured by precision."""

from __future__ import annotations

import html
import json
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
    through, down to the rule that started it; then how its inputs reach it."""
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


COLOURS = {"float16": "#3b82f6", "bfloat16": "#6366f1", "float32": "#f59e0b", "none": "#9ca3af"}


def html_page(plan: Plan, graph: OpGraph) -> str:
    """One self-contained page: the graph laid out by depth, nodes coloured by precision,
    inserted casts marked on their edges, each node's reason shown on hover."""
    depth: dict[str, int] = {}
    flow_edges: list[tuple[str, str, str]] = []
    for op_node in graph:
        level = 0
        for tensor in op_node.inputs:
            producer = graph.tensors[tensor].producer if tensor in graph.tensors else None
            if producer is not None:
                level = max(level, depth[producer] + 1)
                flow_edges.append((producer, op_node.name, tensor))
        depth[op_node.name] = level
    columns: dict[int, int] = defaultdict(int)
    position: dict[str, tuple[int, int]] = {}
    for op_node in graph:
        level = depth[op_node.name]
        position[op_node.name] = (columns[level], level)
        columns[level] += 1
    cast_edges = {(c.tensor, reader) for c in plan.casts for reader in c.consumers}
    x_step, y_step, box_w, box_h = 190, 70, 170, 40
    width = (max(columns.values(), default=1)) * x_step + 40
    height = (max(depth.values(), default=0) + 1) * y_step + 40

    def centre(name: str) -> tuple[int, int]:
        col, row = position[name]
        return 20 + col * x_step + box_w // 2, 20 + row * y_step + box_h // 2

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for producer, consumer, tensor in flow_edges:
        (x1, y1), (x2, y2) = centre(producer), centre(consumer)
        cast = (tensor, consumer) in cast_edges
        label = f"<title>{html.escape(tensor)}{' (cast here)' if cast else ''}</title>"
        parts.append(
            f'<line class="edge{" cast" if cast else ""}" x1="{x1}" y1="{y1 + box_h // 2}" '
            f'x2="{x2}" y2="{y2 - box_h // 2}">{label}</line>'
        )
        if cast:
            mx, my = (x1 + x2) // 2, (y1 + y2) // 2
            parts.append(
                f'<rect class="cast-mark" x="{mx - 5}" y="{my - 5}" width="10" height="10" '
                f'transform="rotate(45 {mx} {my})"><title>Cast of {html.escape(tensor)}'
                f"</title></rect>"
            )
    for op_node in graph:
        decision = plan.nodes[op_node.name]
        col, row = position[op_node.name]
        x, y = 20 + col * x_step, 20 + row * y_step
        colour = COLOURS.get(decision.precision, "#10b981")
        tip = html.escape(
            f"{op_node.name}\n{decision.op}: {decision.precision}\n"
            f"{decision.rule}: {decision.reason}"
            + (f"\nvia {decision.via}" if decision.via else "")
        )
        label = html.escape(decision.op if len(op_node.name) > 22 else op_node.name)
        parts.append(
            f'<g class="node" data-name="{html.escape(op_node.name)}" '
            f'data-precision="{decision.precision}"><title>{tip}</title>'
            f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="6" '
            f'fill="{colour}"/><text x="{x + 8}" y="{y + 25}">{label}</text></g>'
        )
    parts.append("</svg>")
    summary = plan.summary()
    legend = "".join(
        f'<span class="key" style="background:{colour}">{name}</span>'
        for name, colour in COLOURS.items()
    )
    counts = ", ".join(f"{n} {p}" for p, n in summary["nodes"].items())  # type: ignore[union-attr]
    data = json.dumps({"nodes": len(plan.nodes), "casts": summary["casts_inserted"]})
    casts_word = "cast" if summary["casts_inserted"] == 1 else "casts"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>graphamp plan: {html.escape(plan.model or "model")} ({plan.dtype})</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 16px; }}
.key {{ color: white; padding: 2px 8px; margin-right: 6px; border-radius: 4px; }}
.node text {{ fill: white; font: 12px monospace; pointer-events: none; }}
.edge {{ stroke: #6b7280; stroke-width: 1.2; }}
.edge.cast {{ stroke: #dc2626; stroke-width: 2; stroke-dasharray: 4 3; }}
.cast-mark {{ fill: #dc2626; }}
#status.error {{ color: #dc2626; }}
</style></head>
<body>
<h1>graphamp plan: {html.escape(plan.model or "model")} &rarr; {plan.dtype}</h1>
<p><span id="node-count">{len(plan.nodes)}</span> nodes ({html.escape(counts)});
<span id="cast-count">{summary["casts_inserted"]}</span> {casts_word} inserted (red, dashed);
MatMul/Gemm/Conv in {plan.dtype}: {summary["matrix_ops_low"]} of {summary["matrix_ops"]}.
Hover a node for its reason.</p>
<p>{legend}</p>
<p id="status">checking&hellip;</p>
{"".join(parts)}
<script>
const claimed = {data};
const drawn = document.querySelectorAll("g.node").length;
const status = document.getElementById("status");
if (drawn === claimed.nodes) {{
  status.textContent = "drawn: " + drawn + " nodes";
  document.body.dataset.drawn = String(drawn);
}} else {{
  status.textContent = "drawing mismatch: " + drawn + " drawn, " + claimed.nodes + " in the plan";
  status.className = "error";
}}
</script>
</body></html>
"""
