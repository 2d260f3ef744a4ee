"""The table ``graphamp convert`` and ``graphamp demo`` print after converting."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from graphamp.plan import Plan

# Rules that keep an op float32 for a reason of the graph itself, shown in the summary.
NOTABLE_RULES = {
    "schema": "its schema does not admit the type",
    "weight_range": "a weight would overflow",
    "type_unknown": "input type unknown",
    "opaque": "no schema (custom op)",
    "control_flow": "owns bodies graphamp does not enter",
    "range": "values out of range on data",
    "tuned": "graphamp tune kept it",
}


def print_summary(console: Console, plan: Plan, seconds: float, source: Path, target: Path) -> None:
    from rich.table import Table

    summary = plan.summary()
    weights = plan.weights
    before = sum(w.bytes_before for w in weights if w.in_place)
    after = sum(w.bytes_after for w in weights)
    table = Table(
        title=f"{source.name} -> {target.name} ({plan.dtype})",
        title_justify="left",
        show_header=False,
    )
    table.add_column("what")
    table.add_column("value", justify="right")
    for precision, count in summary["nodes"].items():  # type: ignore[union-attr]
        label = "nodes with no float math" if precision == "none" else f"nodes in {precision}"
        table.add_row(label, str(count))
    table.add_row(
        "MatMul/Gemm/Conv in low precision",
        f"{summary['matrix_ops_low']} of {summary['matrix_ops']}",
    )
    if plan.rewrites:
        table.add_row("norms fused (--no-fuse keeps them)", str(len(plan.rewrites)))
    table.add_row("casts inserted", str(summary["casts_inserted"]))
    if summary["casts_removed"] or summary["casts_retargeted"]:
        table.add_row(
            "casts removed / retargeted",
            f"{summary['casts_removed']} / {summary['casts_retargeted']}",
        )
    table.add_row("weights converted", f"{len(weights)} ({size(before)} -> {size(after)})")
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
    table.add_row("time", f"{seconds:.2f} s")
    console.print(table)


def nothing_converted(plan: Plan) -> str | None:
    """Why no node of ``plan`` was put into its dtype, when none was."""
    if (
        any(d.precision == plan.dtype and d.rule != "already_low" for d in plan.nodes.values())
        or plan.weights
    ):
        return None
    low = [d for d in plan.nodes.values() if d.rule == "already_low"]
    if low:
        types = sorted({str(d.precision) for d in low})
        return (
            f"nothing converted: {len(low)} nodes already compute in {', '.join(types)}; "
            "the output is the input's graph"
        )
    return f"nothing converted: no node runs in {plan.dtype} under this policy"


def size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"
