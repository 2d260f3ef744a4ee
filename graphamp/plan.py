"""Plan: every precision decision with its reason, the casts and the weight conversions.

The Plan has two faces:

* the *record* (``nodes``, ``casts``, ``weights``, ``summary``), which serialises to stable,
  sorted JSON: the same model and policy always give the same bytes, so CI can diff it;
* the *edits* (:class:`Edits`), the exact slot-level changes a dialect applies to its model.
  They are derived data and are not written to the JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from graphamp.errors import GraphampError

PLAN_FORMAT = "graphamp-plan"
PLAN_VERSION = 1

# Op types the summary counts as "matrix work": ONNX ops, and the aten ops of PyTorch graphs.
MATRIX_OPS = frozenset(
    {
        "MatMul",
        "Gemm",
        "Conv",
        "ConvTranspose",
        "Einsum",
        "linear",
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "einsum",
        "conv1d",
        "conv2d",
        "conv3d",
        "convolution",
        "_convolution",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "scaled_dot_product_attention",
    }
)


@dataclass
class NodeDecision:
    """The precision one node computes in, and why.

    ``rule`` is a short stable key (``allow``, ``infer``, ``clear``, ``deny``, ``deny_spread``,
    ``deny_name``, ``deny_tensor``, ``unlisted``, ``schema``, ``weight_range``,
    ``control_flow``, ``opaque``, ``type_unknown``, ``already_low``, ``no_float``, ``cast``);
    ``reason`` is the sentence for people; ``via`` names the neighbour a colour spread through.
    """

    op: str
    precision: str
    rule: str
    reason: str
    via: str | None = None
    flops: int | None = None  # matrix ops with known shapes: 2 x multiply-adds


@dataclass
class CastRecord:
    """One Cast the conversion inserts: ``tensor`` converted ``src`` -> ``dst`` as ``output``."""

    tensor: str
    src: str
    dst: str
    output: str
    consumers: list[str]
    purpose: str = "precision boundary"  # or "graph output kept as float32", ...


@dataclass
class WeightRecord:
    """A stored value (initializer or Constant) converted instead of cast at run time."""

    name: str
    src: str
    dst: str
    stored_as: str  # the name the converted copy is stored under (``name`` when in place)
    in_place: bool
    elements: int
    bytes_before: int
    bytes_after: int
    flushed_to_zero: int  # non-zero values that became zero in ``dst``
    consumers: list[str] = field(default_factory=list)
    # values beyond the target type's range: such a weight is kept (src == dst) with its readers
    out_of_range: int = 0


@dataclass
class Edits:
    """Slot-level changes, in the order a dialect should apply them."""

    retype: dict[str, str] = field(default_factory=dict)  # tensor -> new dtype
    # (node, input slot) -> tensor it reads instead (a cast output, a weight copy, a source)
    rewire: dict[tuple[str, int], str] = field(default_factory=dict)
    casts: list[CastRecord] = field(default_factory=list)
    output_casts: list[CastRecord] = field(default_factory=list)  # keep_io_types outputs
    weights: list[WeightRecord] = field(default_factory=list)
    # weights left in their type because values would overflow the target (never clamped)
    kept_weights: list[WeightRecord] = field(default_factory=list)
    retarget_casts: dict[str, str] = field(default_factory=dict)  # Cast node -> new target
    remove_nodes: list[str] = field(default_factory=list)  # pre-existing Casts made redundant


@dataclass
class Plan:
    """Decisions for one graph under one policy."""

    dtype: str
    policy: dict[str, object]
    nodes: dict[str, NodeDecision] = field(default_factory=dict)
    edits: Edits = field(default_factory=Edits)
    model: str = ""

    # -- summary ------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Nodes per precision (casts counted apart)."""
        counts: dict[str, int] = {}
        for decision in self.nodes.values():
            counts[decision.precision] = counts.get(decision.precision, 0) + 1
        return dict(sorted(counts.items()))

    def summary(self) -> dict[str, object]:
        matrix = [n for n, d in self.nodes.items() if d.op in MATRIX_OPS]
        low_matrix = [n for n in matrix if self.nodes[n].precision == self.dtype]
        known = [self.nodes[n] for n in matrix if self.nodes[n].flops is not None]
        total_flops = sum(d.flops for d in known)  # type: ignore[misc]
        low_flops = sum(d.flops for d in known if d.precision == self.dtype)  # type: ignore[misc]
        weights = self.edits.weights
        return {
            "nodes": self.counts(),
            "casts_inserted": len(self.edits.casts) + len(self.edits.output_casts),
            "casts_retargeted": len(self.edits.retarget_casts),
            "casts_removed": len(self.edits.remove_nodes),
            "matrix_ops": len(matrix),
            "matrix_ops_low": len(low_matrix),
            "matrix_flops_low_share": round(low_flops / total_flops, 6) if total_flops else None,
            "weights_converted": len(weights),
            "weight_bytes_saved": sum(w.bytes_before - w.bytes_after for w in weights if w.in_place)
            - sum(w.bytes_after for w in weights if not w.in_place),
            "values_flushed_to_zero": sum(w.flushed_to_zero for w in weights),
            "weights_kept_out_of_range": len(self.edits.kept_weights),
        }

    # -- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, object]:
        """The plan as plain data, every list sorted by a stable key (see PLAN_SCHEMA.md)."""
        edits = self.edits
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "model": self.model,
            "dtype": self.dtype,
            "policy": self.policy,
            "summary": self.summary(),
            "nodes": {name: _drop_none(asdict(d)) for name, d in sorted(self.nodes.items())},
            "casts": [
                _cast_dict(c)
                for c in sorted(
                    edits.casts + edits.output_casts, key=lambda c: (c.tensor, c.dst, c.output)
                )
            ],
            "casts_retargeted": dict(sorted(edits.retarget_casts.items())),
            "casts_removed": sorted(edits.remove_nodes),
            "weights": [
                asdict(w)
                for w in sorted(edits.weights + edits.kept_weights, key=lambda w: (w.name, w.dst))
            ],
        }

    def to_json(self) -> str:
        """Stable JSON with one line per node, cast and weight, so that a one-node change is a
        one-line change in ``git diff`` too."""
        data = self.to_dict()
        lines = ["{"]
        keys = list(data)
        for index, key in enumerate(keys):
            comma = "," if index < len(keys) - 1 else ""
            value = data[key]
            if key in ("nodes", "casts_retargeted") and isinstance(value, dict) and value:
                items = [f"  {json.dumps(k)}: {_compact(v)}" for k, v in value.items()]
                lines.append(
                    f"  {json.dumps(key)}: {{\n"
                    + ",\n".join("  " + item for item in items)
                    + f"\n  }}{comma}"
                )
            elif key in ("casts", "weights", "casts_removed") and isinstance(value, list) and value:
                items = [f"    {_compact(v)}" for v in value]
                lines.append(f"  {json.dumps(key)}: [\n" + ",\n".join(items) + f"\n  ]{comma}")
            else:
                lines.append(f"  {json.dumps(key)}: {_compact(value)}{comma}")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def save(self, path: str | Path) -> None:
        from graphamp.io import write_atomic  # local: plan.py stays import-light

        write_atomic(Path(path), self.to_json().encode("utf-8"))

    @classmethod
    def from_dict(cls, data: dict[str, object], *, where: str = "plan") -> Plan:
        if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
            raise GraphampError(f'{where}: not a graphamp plan (no "format": "{PLAN_FORMAT}")')
        if data.get("version") != PLAN_VERSION:
            raise GraphampError(
                f"{where}: plan version {data.get('version')} is not supported "
                f"(this graphamp reads version {PLAN_VERSION})"
            )
        try:
            nodes = {name: NodeDecision(**d) for name, d in data["nodes"].items()}  # type: ignore[union-attr]
            casts = [_cast_record(c) for c in data["casts"]]  # type: ignore[union-attr]
            weights = [WeightRecord(**w) for w in data["weights"]]  # type: ignore[union-attr]
        except (KeyError, TypeError, AttributeError) as exc:
            raise GraphampError(f"{where}: malformed plan ({exc})") from None
        edits = Edits(
            casts=[c for c in casts if c.purpose == "precision boundary"],
            output_casts=[c for c in casts if c.purpose != "precision boundary"],
            weights=[w for w in weights if w.src != w.dst],
            kept_weights=[w for w in weights if w.src == w.dst],
            retarget_casts=dict(data.get("casts_retargeted", {})),  # type: ignore[arg-type]
            remove_nodes=list(data.get("casts_removed", [])),  # type: ignore[arg-type]
        )
        return cls(
            dtype=str(data["dtype"]),
            policy=dict(data["policy"]),  # type: ignore[arg-type]
            nodes=nodes,
            edits=edits,
            model=str(data.get("model", "")),
        )

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise GraphampError(f"{path}: plan file not found") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise GraphampError(f"{path}: not a JSON plan: {exc}") from None
        return cls.from_dict(data, where=str(path))

    def diff(self, other: Plan) -> PlanDiff:
        """What changed from ``self`` to ``other`` (see :class:`PlanDiff`)."""
        return PlanDiff.between(self, other)


@dataclass
class PlanDiff:
    """The difference between two plans, by stable identity: node name; (tensor, to) for a
    cast; (weight, to) for a weight conversion."""

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

    @classmethod
    def between(cls, old: Plan, new: Plan) -> PlanDiff:
        diff = cls(old.model or "a", new.model or "b")
        if old.dtype != new.dtype:
            diff.dtype = (old.dtype, new.dtype)
        for name in sorted(old.nodes.keys() | new.nodes.keys()):
            before, after = old.nodes.get(name), new.nodes.get(name)
            if before is None:
                diff.nodes_added.append((name, after))  # type: ignore[arg-type]
            elif after is None:
                diff.nodes_removed.append((name, before))
            elif before.precision != after.precision:
                diff.nodes_changed.append((name, before, after))

        def keyed_casts(plan: Plan) -> dict[tuple[str, str, str], CastRecord]:
            return {
                (c.tensor, c.dst, c.output): c for c in plan.edits.casts + plan.edits.output_casts
            }

        def keyed_weights(plan: Plan) -> dict[tuple[str, str, bool], WeightRecord]:
            edits = plan.edits
            return {(w.name, w.dst, w.in_place): w for w in edits.weights + edits.kept_weights}

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
        old_summary, new_summary = _flat(old.summary()), _flat(new.summary())
        for key in sorted(old_summary.keys() | new_summary.keys()):
            if old_summary.get(key) != new_summary.get(key):
                diff.summary[key] = (old_summary.get(key), new_summary.get(key))
        return diff

    @property
    def empty(self) -> bool:
        return not (
            self.dtype
            or self.nodes_changed
            or self.nodes_added
            or self.nodes_removed
            or self.casts_added
            or self.casts_removed
            or self.weights_added
            or self.weights_removed
        )

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
        if self.summary:
            lines.append("@@ summary @@")
            lines += [f" {key}: {a} -> {b}" for key, (a, b) in self.summary.items()]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, object]:
        return {
            "old": self.old_label,
            "new": self.new_label,
            "dtype": list(self.dtype) if self.dtype else None,
            "nodes_changed": [
                {"node": n, "op": a.op, "from": a.precision, "to": b.precision, "reason": b.reason}
                for n, a, b in self.nodes_changed
            ],
            "nodes_added": [{"node": n, **_drop_none(asdict(d))} for n, d in self.nodes_added],
            "nodes_removed": [{"node": n, **_drop_none(asdict(d))} for n, d in self.nodes_removed],
            "casts_added": [_cast_dict(c) for c in self.casts_added],
            "casts_removed": [_cast_dict(c) for c in self.casts_removed],
            "weights_added": [asdict(w) for w in self.weights_added],
            "weights_removed": [asdict(w) for w in self.weights_removed],
            "summary": {k: {"from": a, "to": b} for k, (a, b) in self.summary.items()},
        }


def _flat(summary: dict[str, object]) -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in summary.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def _cast_line(cast: CastRecord) -> str:
    readers = ", ".join(cast.consumers) if cast.consumers else cast.purpose
    return f"Cast {cast.tensor}: {cast.src} -> {cast.dst} as {cast.output}  ({readers})"


def _weight_line(weight: WeightRecord) -> str:
    if weight.src == weight.dst:
        return (
            f"{weight.name}: kept {weight.src}, {weight.out_of_range} values beyond the "
            "target type's range"
        )
    where = "in place" if weight.in_place else f"copy {weight.stored_as}"
    return f"{weight.name}: {weight.src} -> {weight.dst} ({where}, {weight.bytes_after} bytes)"


def _cast_dict(cast: CastRecord) -> dict[str, object]:
    return {
        "tensor": cast.tensor,
        "from": cast.src,
        "to": cast.dst,
        "output": cast.output,
        "consumers": cast.consumers,
        "purpose": cast.purpose,
    }


def _cast_record(data: dict[str, object]) -> CastRecord:
    return CastRecord(
        tensor=data["tensor"],
        src=data["from"],
        dst=data["to"],  # type: ignore[arg-type]
        output=data["output"],
        consumers=list(data["consumers"]),  # type: ignore[arg-type, call-overload]
        purpose=data["purpose"],
    )  # type: ignore[arg-type]


def _compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _drop_none(record: dict[str, object]) -> dict[str, object]:
    return {key: value for key, value in record.items() if value is not None}
