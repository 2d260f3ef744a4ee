"""The difference between two plans, by stable identity: node name; (tensor, to, output) for a
cast; (weight, to, in place) for a weight; node name for a float8 decision; (tensor, format)
for a float8 scale. What ``graphamp diff`` and ``graphamp check`` show.

Float8 scales are compared by what they are, not by the values calibration measured: their
granularity, source and the source's settings (a delayed history's length, algorithm and
margin; a weight's channel axis), never ``amax`` or the number of batches, which move with
the data the way a Cast's bytes move with the shapes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import cast

from graphamp.core.text import printable_lines
from graphamp.plans.records import (
    CastRecord,
    Fp8Decision,
    JsonObject,
    NodeDecision,
    PlanRecords,
    ScaleRecord,
    WeightRecord,
    decision_dict,
)

MEASURED = frozenset({"amax", "batches"})  # a scale's detail that data, not settings, give


@dataclass
class PlanDiff:
    old_label: str
    new_label: str
    nodes_changed: list[tuple[str, NodeDecision, NodeDecision]] = field(default_factory=list)
    nodes_added: list[tuple[str, NodeDecision]] = field(default_factory=list)
    nodes_removed: list[tuple[str, NodeDecision]] = field(default_factory=list)
    casts_added: list[CastRecord] = field(default_factory=list)
    casts_removed: list[CastRecord] = field(default_factory=list)
    weights_added: list[WeightRecord] = field(default_factory=list)
    weights_removed: list[WeightRecord] = field(default_factory=list)
    summary: dict[str, tuple[object, object]] = field(default_factory=dict)
    dtype: tuple[str, str] | None = None
    # float8 (only where either plan has it): the settings, decisions and scales that differ
    fp8_settings: tuple[object, object] | None = None
    fp8_changed: list[tuple[str, Fp8Decision | None, Fp8Decision | None]] = field(
        default_factory=list
    )
    scales_changed: list[tuple[ScaleRecord | None, ScaleRecord | None]] = field(
        default_factory=list
    )
    with_fp8: bool = False

    @classmethod
    def between(cls, old: PlanRecords, new: PlanRecords) -> PlanDiff:
        diff = cls(old.model or "a", new.model or "b")
        if old.dtype != new.dtype:
            diff.dtype = (old.dtype, new.dtype)
        for name in sorted(old.nodes.keys() | new.nodes.keys()):
            before, after = old.nodes.get(name), new.nodes.get(name)
            if before is None:
                diff.nodes_added.append((name, new.nodes[name]))
            elif after is None:
                diff.nodes_removed.append((name, before))
            elif before.precision != after.precision:
                diff.nodes_changed.append((name, before, after))

        def keyed_casts(plan: PlanRecords) -> dict[tuple[str, str, str], CastRecord]:
            return {(c.tensor, c.dst, c.output): c for c in plan.all_casts()}

        def keyed_weights(plan: PlanRecords) -> dict[tuple[str, str, bool], WeightRecord]:
            return {(w.name, w.dst, w.in_place): w for w in plan.all_weights()}

        old_casts, new_casts = keyed_casts(old), keyed_casts(new)
        diff.casts_added = [new_casts[k] for k in sorted(new_casts.keys() - old_casts.keys())]
        diff.casts_removed = [old_casts[k] for k in sorted(old_casts.keys() - new_casts.keys())]
        old_weights, new_weights = keyed_weights(old), keyed_weights(new)
        diff.weights_added = [
            new_weights[k] for k in sorted(new_weights.keys() - old_weights.keys())
        ]
        diff.weights_removed = [
            old_weights[k] for k in sorted(old_weights.keys() - new_weights.keys())
        ]
        diff._fp8_between(old, new)
        old_summary, new_summary = _flat(old.summary()), _flat(new.summary())
        for key in sorted(old_summary.keys() | new_summary.keys()):
            if old_summary.get(key) != new_summary.get(key):
                diff.summary[key] = (old_summary.get(key), new_summary.get(key))
        return diff

    def _fp8_between(self, old: PlanRecords, new: PlanRecords) -> None:
        self.with_fp8 = old.fp8_settings is not None or new.fp8_settings is not None
        if not self.with_fp8:
            return
        if old.fp8_settings != new.fp8_settings:
            self.fp8_settings = (old.fp8_settings, new.fp8_settings)
        for name in sorted(old.fp8.keys() | new.fp8.keys()):
            before, after = old.fp8.get(name), new.fp8.get(name)
            if before is None or after is None or before.precision != after.precision:
                self.fp8_changed.append((name, before, after))
        old_scales = {r.key(): r for r in old.scales}
        new_scales = {r.key(): r for r in new.scales}
        for key in sorted(old_scales.keys() | new_scales.keys()):
            was, now = old_scales.get(key), new_scales.get(key)
            if was is None or now is None or _scale_kind(was) != _scale_kind(now):
                self.scales_changed.append((was, now))

    @property
    def empty(self) -> bool:
        return not (
            self.fp8_settings
            or self.fp8_changed
            or self.scales_changed
            or self.dtype
            or self.nodes_changed
            or self.nodes_added
            or self.nodes_removed
            or self.casts_added
            or self.casts_removed
            or self.weights_added
            or self.weights_removed
        )

    def changed_nodes(self) -> list[str]:
        """Every node the diff names, sorted: those whose precision changed, added or
        removed, and those whose float8 decision or operand scales changed."""
        names = {n for n, _, _ in self.nodes_changed}
        names |= {n for n, _ in self.nodes_added} | {n for n, _ in self.nodes_removed}
        return sorted(names | set(self.fp8_changed_nodes()))

    def fp8_changed_nodes(self) -> list[str]:
        """The nodes whose float8 decision changed, and the float8 readers of a scale record
        that changed (its granularity, source or settings), sorted."""
        names = {name for name, _, _ in self.fp8_changed}
        for before, after in self.scales_changed:
            names.update(*(record.consumers for record in (before, after) if record is not None))
        return sorted(names)

    def to_text(self) -> str:
        """A unified-diff-like text: ``-`` old, ``+`` new, one line per node, cast, weight."""
        lines = [f"--- {self.old_label}", f"+++ {self.new_label}"]
        if self.dtype:
            lines += ["@@ dtype @@", f"-{self.dtype[0]}", f"+{self.dtype[1]}"]
        node_count = len(self.nodes_changed) + len(self.nodes_added) + len(self.nodes_removed)
        if node_count:
            lines.append(f"@@ nodes: {node_count} changed @@")
            for name, before, after in self.nodes_changed:
                lines.append(f"-{name}  {before.op}  {before.precision}  ({before.reason})")
                lines.append(f"+{name}  {after.op}  {after.precision}  ({after.reason})")
            lines += [
                f"-{name}  {d.op}  {d.precision}  ({d.reason})" for name, d in self.nodes_removed
            ]
            lines += [
                f"+{name}  {d.op}  {d.precision}  ({d.reason})" for name, d in self.nodes_added
            ]
        if self.casts_added or self.casts_removed:
            lines.append(
                f"@@ casts: {len(self.casts_removed)} removed, {len(self.casts_added)} added @@"
            )
            lines += [f"-{_cast_line(c)}" for c in self.casts_removed]
            lines += [f"+{_cast_line(c)}" for c in self.casts_added]
        if self.weights_added or self.weights_removed:
            lines.append("@@ weights @@")
            lines += [f"-{_weight_line(w)}" for w in self.weights_removed]
            lines += [f"+{_weight_line(w)}" for w in self.weights_added]
        lines += self._fp8_text()
        if self.summary:
            lines.append("@@ summary @@")
            lines += [f" {key}: {_shown(a)} -> {_shown(b)}" for key, (a, b) in self.summary.items()]
        return printable_lines(lines)  # names and reasons come from the models

    def to_dict(self) -> dict[str, object]:
        return {
            "old": self.old_label,
            "new": self.new_label,
            "dtype": list(self.dtype) if self.dtype else None,
            "nodes_changed": [
                {"node": n, "op": a.op, "from": a.precision, "to": b.precision, "reason": b.reason}
                for n, a, b in self.nodes_changed
            ],
            "nodes_added": [{"node": n, **decision_dict(d)} for n, d in self.nodes_added],
            "nodes_removed": [{"node": n, **decision_dict(d)} for n, d in self.nodes_removed],
            "casts_added": [c.to_dict() for c in self.casts_added],
            "casts_removed": [c.to_dict() for c in self.casts_removed],
            "weights_added": [w.to_dict() for w in self.weights_added],
            "weights_removed": [w.to_dict() for w in self.weights_removed],
            "summary": {k: {"from": a, "to": b} for k, (a, b) in self.summary.items()},
        } | self._fp8_dict()

    def _fp8_text(self) -> list[str]:
        lines: list[str] = []
        if self.fp8_settings:
            lines += ["@@ fp8 settings @@", f"-{self.fp8_settings[0]}", f"+{self.fp8_settings[1]}"]
        if self.fp8_changed:
            lines.append(f"@@ fp8: {len(self.fp8_changed)} changed @@")
            for name, before, after in self.fp8_changed:
                lines += [f"-{name}  {_fp8_line(before)}"] if before else []
                lines += [f"+{name}  {_fp8_line(after)}"] if after else []
        if self.scales_changed:
            lines.append(f"@@ scales: {len(self.scales_changed)} changed @@")
            for was, now in self.scales_changed:
                lines += [f"-{_scale_line(was)}"] if was else []
                lines += [f"+{_scale_line(now)}"] if now else []
        return lines

    def _fp8_dict(self) -> dict[str, object]:
        """The float8 differences (keys only where either plan has float8, so other diffs
        keep their JSON)."""
        if not self.with_fp8:
            return {}
        return {
            "fp8_settings": (
                {"from": self.fp8_settings[0], "to": self.fp8_settings[1]}
                if self.fp8_settings
                else None
            ),
            "fp8_changed": [
                {
                    "node": name,
                    "from": before.to_dict() if before else None,
                    "to": after.to_dict() if after else None,
                }
                for name, before, after in self.fp8_changed
            ],
            "scales_changed": [
                {"from": a.to_dict() if a else None, "to": b.to_dict() if b else None}
                for a, b in self.scales_changed
            ],
        }


def _shown(value: object) -> str:
    """A summary entry in the text diff; one that plan does not have (a count of 0 is left
    out, float8's entries exist only in float8 plans) is "absent", not Python's None."""
    return "absent" if value is None else str(value)


def _flat(summary: dict[str, object]) -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in summary.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def same_record(old: PlanRecords, new: PlanRecords) -> bool:
    """Whether two plans record the same thing, float8 scales' measured values (``amax``,
    batches) aside: what ``graphamp check`` accepts as no drift."""
    return _comparable(old) == _comparable(new)


def record_changes(
    old: PlanRecords, new: PlanRecords, limit: int = 8
) -> dict[str, tuple[object, object]]:
    """What two plans record differently beyond their decisions (the model's file name, an
    op, a reason, the policy): up to ``limit`` fields, each path -> (old, new), for a drift
    ``graphamp check`` reports that the decision diff does not show."""
    changes: dict[str, tuple[object, object]] = {}

    def walk(path: str, a: object, b: object) -> None:
        if len(changes) >= limit or a == b:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(a.keys() | b.keys(), key=str):
                walk(f"{path}[{key!r}]" if path else str(key), a.get(key), b.get(key))
        else:
            changes[path] = (a, b)

    walk("", _comparable_data(old), _comparable_data(new))
    return changes


def _comparable(plan: PlanRecords) -> str:
    if not plan.scales:
        return plan.to_json()
    return json.dumps(_comparable_data(plan), sort_keys=True)


def _comparable_data(plan: PlanRecords) -> JsonObject:
    """``plan`` as its JSON object, float8 scales' measured values left out."""
    data = plan.to_dict()
    for record in cast(list[JsonObject], data.get("scales", [])):  # ScaleRecord.to_dict's
        record["detail"] = {k: v for k, v in record["detail"].items() if k not in MEASURED}
    return data


def _scale_kind(record: ScaleRecord) -> tuple[object, ...]:
    """What a diff compares of a scale: granularity, source and its settings, not values."""
    settings = sorted((k, str(v)) for k, v in record.detail.items() if k not in MEASURED)
    return (record.granularity, record.source, tuple(settings))


def _fp8_line(decision: Fp8Decision) -> str:
    return f"{decision.precision}  {decision.rule}  ({decision.reason})"


def _scale_line(record: ScaleRecord) -> str:
    readers = ", ".join(record.consumers)
    return f"scale {record.tensor}: {record.describe()}  ({readers})"


def _cast_line(cast: CastRecord) -> str:
    readers = ", ".join(cast.consumers) if cast.consumers else cast.purpose
    return f"Cast {cast.tensor}: {cast.src} -> {cast.dst} as {cast.output}  ({readers})"


def _weight_line(weight: WeightRecord) -> str:
    if weight.kept:
        return (
            f"{weight.name}: kept {weight.src}, {weight.out_of_range} values beyond the "
            "target type's range"
        )
    where = "in place" if weight.in_place else f"copy {weight.stored_as}"
    return f"{weight.name}: {weight.src} -> {weight.dst} ({where}, {weight.bytes_after} bytes)"
