"""The table ``graphamp convert`` and ``graphamp demo`` print after converting."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from graphamp.cli.common import shown
from graphamp.core.io import size_text

if TYPE_CHECKING:
    from rich.console import Console

    from graphamp.engine import Conversion
    from graphamp.plans.plan import Plan

# Rules that keep an op float32 for a reason of the graph itself, shown in the summary.
NOTABLE_RULES = {
    "schema": "its schema does not admit the type",
    "weight_range": "a weight would overflow",
    "type_unknown": "input type unknown",
    "opaque": "no schema (custom op)",
    "control_flow": "owns bodies graphamp does not enter",
    "range": "values out of range on data",
    "tuned": "graphamp tune kept it",
    "integer_range": "reads a wide integer cast to float",
    "integer_valued": "its result is used as an integer",
    "kept": "the input model keeps it float32",
}


def print_summary(
    console: Console,
    plan: Plan,
    seconds: float,
    source: Path,
    target: Path,
    conversion: Conversion | None = None,
) -> None:
    """The table after a conversion; with ``conversion`` (its graph and edits) also the weight
    bytes kept float32 and why, and then, below the table, each graph input and output
    whose type changed (what the caller's feeding code must follow)."""
    from rich.table import Table

    summary = plan.summary()
    weights = plan.weights
    before = sum(w.bytes_before for w in weights if w.in_place)
    # weights the float8 writer stores in 8 bits (float8 operands, --fp8-kept-int8 weights,
    # --fp8-embeddings tables) after their conversion: one byte an element, not the low type's
    eight_bit = {record.tensor for record in plan.scales if record.source == "weight"}
    in_8_bits = {w.name for w in weights if w.name in eight_bit or w.stored_as in eight_bit}
    after = sum(w.elements if w.name in in_8_bits else w.bytes_after for w in weights)
    table = Table(
        title=shown(f"{source.name} -> {target.name} ({plan.dtype})"),
        title_justify="left",
        show_header=False,
    )
    table.add_column("what")
    table.add_column("value", justify="right")
    for precision, count in plan.counts().items():
        label = "nodes with no float math" if precision == "none" else f"nodes in {precision}"
        table.add_row(label, str(count))
    # matrix ops the model already computes in another low type (a float16 model converted
    # with --dtype bfloat16) are low too, though not in the plan's dtype
    other = Counter(
        str(plan.nodes[name].precision)
        for name in plan.matrix_nodes()
        if plan.nodes[name].rule == "already_low" and plan.nodes[name].precision != plan.dtype
    )
    already = "".join(f", {count} already {low}" for low, count in sorted(other.items()))
    table.add_row(
        "MatMul/Gemm/Conv in low precision",
        f"{summary['matrix_ops_low']} of {summary['matrix_ops']}{already}",
    )
    if plan.fp8_settings is not None:
        table.add_row(
            "of them with float8 operands (plan: fp8)",
            f"{summary['matrix_ops_fp8']} of {summary['matrix_ops_low']}",
        )
        if "weights_int8" in summary:
            table.add_row("kept ones' weights stored int8", str(summary["weights_int8"]))
        if "tables_8bit" in summary:
            table.add_row("embedding tables stored int8", str(summary["tables_8bit"]))
    if plan.rewrites:
        table.add_row("norms fused (--no-fuse keeps them)", str(len(plan.rewrites)))
    table.add_row("casts inserted", str(summary["casts_inserted"]))
    if summary["casts_removed"] or summary["casts_retargeted"]:
        table.add_row(
            "casts removed / retargeted",
            f"{summary['casts_removed']} / {summary['casts_retargeted']}",
        )
    table.add_row(
        "weights converted", f"{len(weights)} ({size_text(before)} -> {size_text(after)})"
    )
    if in_8_bits:
        table.add_row("of them stored in 8 bits", str(len(in_8_bits)))
    if summary["values_flushed_to_zero"]:
        table.add_row("weight values flushed to zero", str(summary["values_flushed_to_zero"]))
    at_limit = sum(w.at_limit for w in weights)
    if at_limit:
        table.add_row(
            "weight values at float32's limit, stored at half the target's", f"{at_limit}"
        )
    kept: dict[str, int] = {}
    for decision in plan.nodes.values():
        if decision.rule in NOTABLE_RULES and decision.precision == "float32":
            kept[decision.rule] = kept.get(decision.rule, 0) + 1
    for rule, count in sorted(kept.items()):
        table.add_row(f"kept float32: {NOTABLE_RULES[rule]} ({rule})", str(count))
    if conversion is not None:
        for label, value in kept_weights(conversion):
            table.add_row(shown(label), value)  # the largest's name is the model's
    table.add_row("time", f"{seconds:.2f} s")
    console.print(table)
    changed = io_changes(conversion) if conversion is not None else []
    if changed:
        listed = ", ".join(shown(f"{name} {old} -> {new}") for name, old, new in changed)
        console.print(
            f"[yellow]graph inputs/outputs whose type changed[/]: {listed}: feed and read them "
            "in the new type, or convert with --keep-io-types (or --keep-io NAMES) to keep "
            "them float32"
        )


def io_changes(conversion: Conversion) -> list[tuple[str, str, str]]:
    """(name, old type, new type) of each graph input and output the conversion retyped (an
    output cast back to its type by --keep-io-types keeps it)."""
    graph, script = conversion.graph, conversion.script
    if script is None:
        return []
    kept = {record.output for record in script.output_casts}
    changed = []
    for name in (*graph.graph_inputs, *graph.graph_outputs):
        new = script.retype.get(name)
        tensor = graph.tensors.get(name)
        if new is None or tensor is None or name in kept or tensor.is_constant:
            continue
        if new != tensor.dtype and (name, tensor.dtype, new) not in changed:
            changed.append((name, tensor.dtype, new))
    return changed


def kept_weights(conversion: Conversion) -> list[tuple[str, str]]:
    """Rows for the float32 weights the conversion did not store low, by why: the rule of the
    node that reads them (a float32 reader keeps its weight float32), or their values."""
    graph, plan = conversion.graph, conversion.plan
    converted = {w.name for w in plan.weights if w.dst != w.src}
    out_of_range = {w.name for w in plan.weights if w.dst == w.src}
    by_reason: dict[str, list[int]] = {}
    largest: tuple[int, str, str] | None = None
    for name, tensor in graph.tensors.items():
        if not tensor.is_constant or tensor.dtype != "float32" or name in converted:
            continue
        elements = _elements(tensor.shape)
        if elements is None or elements < 2:  # scalars and unknown shapes: not worth a line
            continue
        readers = [node for node, _ in graph.consumers(name)]
        if not readers:
            continue
        if name in out_of_range:
            reason = "values beyond the target type (weight_range)"
        else:
            decision = plan.nodes.get(readers[0])
            rule = decision.rule if decision is not None else "?"
            reason = f"read by a float32 node (rule {rule})"
        tally = by_reason.setdefault(reason, [0, 0])
        tally[0] += 1
        tally[1] += 4 * elements
        if largest is None or 4 * elements > largest[0]:
            largest = (4 * elements, name, f"{readers[0]}, {reason}")
    rows = []
    total = sum(b for _, b in by_reason.values())
    if by_reason:
        weights = sum(c for c, _ in by_reason.values())
        rows.append(("weights kept float32", f"{weights} ({size_text(total)})"))
        for reason, (count, nbytes) in sorted(by_reason.items(), key=lambda item: -item[1][1]):
            rows.append((f"  {reason}", f"{count} ({size_text(nbytes)})"))
    if largest is not None:
        rows.append((f"  largest: {largest[1]!r} ({largest[2]})", size_text(largest[0])))
    return rows


def _elements(shape: tuple[int | str | None, ...] | None) -> int | None:
    if shape is None:
        return None
    count = 1
    for d in shape:
        if not isinstance(d, int):
            return None
        count *= d
    return count


def nothing_converted(plan: Plan) -> str | None:
    """Why no node of ``plan`` was put into its dtype, when none was and no op was fused (a
    model already low whose norms fuse is converted: its graph changes)."""
    if (
        any(d.precision == plan.dtype and d.rule != "already_low" for d in plan.nodes.values())
        or plan.weights
        or plan.rewrites
    ):
        return None
    low = [d for d in plan.nodes.values() if d.rule == "already_low"]
    if low:
        types = sorted({str(d.precision) for d in low})
        kept = sum(d.rule == "kept" for d in plan.nodes.values())
        also = (
            f" and the {kept} float32 ops it keeps stay float32 (rule kept; --allow-name"
            " lowers one)"
            if kept
            else ""
        )
        casts = len(plan.all_casts()) + len(plan.casts_retargeted) + len(plan.casts_removed)
        but = f" but for {casts} Casts (inserted, retargeted or removed)" if casts else ""
        return (
            f"nothing converted: {len(low)} nodes already compute in {', '.join(types)}{also};"
            f" the output is the input's graph{but}"
        )
    # the model can be the cause as much as the policy (Conv below opset 22 admits no
    # bfloat16; quantised ops between float32 quantisers): the rules say which
    rules = Counter(str(d.rule) for d in plan.nodes.values() if d.precision == "float32")
    # the rules that decide first (infer and clear ops follow their neighbours)
    ranked = sorted(rules.items(), key=lambda item: (item[0] in ("infer", "clear"), -item[1]))
    top = ", ".join(f"{rule} {count}" for rule, count in ranked[:3])
    why = f"; its float32 ops by rule: {top} (the plan gives each reason)" if top else ""
    return f"nothing converted: no node runs in {plan.dtype}{why}"
