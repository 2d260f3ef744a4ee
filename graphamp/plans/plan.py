"""Plan: the reviewed record of a conversion, every precision decision with its reason, the
casts and the weight conversions.

The plan is what people review and CI diffs: it serialises to stable, sorted JSON (the same
model and policy always give the same bytes, one line per node, cast and weight). It is not the
edit script a dialect applies (:class:`graphamp.plans.edits.EditScript`): the casts pass derives
that from the graph and the decisions, and a reviewed plan is applied by taking its decisions,
deriving the script again and refusing when the result differs from what was reviewed
(:func:`graphamp.engine.convert` with ``reviewed=``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from graphamp.core.io import write_atomic
from graphamp.core.vocab import Precision, Rule
from graphamp.dialects.registry import matrix_ops_for
from graphamp.errors import GraphampError
from graphamp.plans.plan_check import check_plan_data
from graphamp.plans.plandiff import PlanDiff
from graphamp.plans.records import (
    BOUNDARY,
    CastRecord,
    Fp8Decision,
    JsonObject,
    NodeDecision,
    RewriteRecord,
    ScaleRecord,
    WeightRecord,
    decision_dict,
)

PLAN_FORMAT = "graphamp-plan"
PLAN_VERSION = 2  # the newest version this graphamp reads and writes
# A plan is written at the oldest version that holds it: a plan without float8 is version 1,
# byte for byte what graphamp wrote before float8; version 2 adds "fp8_settings", "fp8" and
# "scales".
FP8_PLAN_VERSION = 2
READABLE_VERSIONS = (1, 2)


@dataclass
class Plan:
    """Decisions for one graph under one policy."""

    dtype: str
    policy: dict[str, object]
    nodes: dict[str, NodeDecision] = field(default_factory=dict)
    casts: list[CastRecord] = field(default_factory=list)  # precision boundaries
    output_casts: list[CastRecord] = field(default_factory=list)  # kept graph outputs
    weights: list[WeightRecord] = field(default_factory=list)  # converted stored values
    # weights left in their type because values would overflow the target (never clamped)
    kept_weights: list[WeightRecord] = field(default_factory=list)
    casts_retargeted: dict[str, str] = field(default_factory=dict)  # Cast node -> new target
    casts_removed: list[str] = field(default_factory=list)  # Casts already in the model
    # patterns of the model's ops replaced by one fused op (a decomposed RMSNorm, say)
    rewrites: list[RewriteRecord] = field(default_factory=list)
    # float8 (passes/fp8.py): the settings, one decision per matrix op decided low, one
    # record per quantised value; None/empty in a plan made without float8
    fp8_settings: dict[str, object] | None = None
    fp8: dict[str, Fp8Decision] = field(default_factory=dict)
    scales: list[ScaleRecord] = field(default_factory=list)
    model: str = ""
    # The dialect's matrix-product op types (for the summary); found from the policy's
    # dialect when not given.
    matrix_ops: frozenset[str] = frozenset()

    def all_casts(self) -> list[CastRecord]:
        return self.casts + self.output_casts

    def all_weights(self) -> list[WeightRecord]:
        return self.weights + self.kept_weights

    # -- summary ------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Nodes per precision (casts counted apart)."""
        counts: dict[str, int] = {}
        for decision in self.nodes.values():
            key = str(decision.precision)
            counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))

    def _matrix_ops(self) -> frozenset[str]:
        if self.matrix_ops:
            return self.matrix_ops
        return matrix_ops_for(str(self.policy.get("dialect", "onnx")))

    def matrix_nodes(self) -> list[str]:
        """Names of the nodes whose op is a matrix product of this plan's dialect."""
        ops = self._matrix_ops()
        return [name for name, decision in self.nodes.items() if decision.op in ops]

    def summary(self) -> dict[str, object]:
        matrix = self.matrix_nodes()
        low_matrix = [n for n in matrix if self.nodes[n].precision == self.dtype]
        known = [self.nodes[n] for n in matrix if self.nodes[n].flops is not None]
        total_flops = sum(d.flops or 0 for d in known)
        low_flops = sum(d.flops or 0 for d in known if d.precision == self.dtype)
        weights = self.weights
        return {
            "nodes": self.counts(),
            "casts_inserted": len(self.casts) + len(self.output_casts),
            # bytes the inserted Casts read and write per run (those of known shape)
            "cast_bytes": sum(c.bytes or 0 for c in self.all_casts()),
            "casts_retargeted": len(self.casts_retargeted),
            "casts_removed": len(self.casts_removed),
            "matrix_ops": len(matrix),
            "matrix_ops_low": len(low_matrix),
            "matrix_flops_low_share": round(low_flops / total_flops, 6) if total_flops else None,
            "weights_converted": len(weights),
            "weight_bytes_saved": sum(w.bytes_before - w.bytes_after for w in weights if w.in_place)
            - sum(w.bytes_after for w in weights if not w.in_place),
            "values_flushed_to_zero": sum(w.flushed_to_zero for w in weights),
            "weights_kept_out_of_range": len(self.kept_weights),
        } | self._fp8_summary()

    def _fp8_summary(self) -> dict[str, object]:
        """The float8 counts (only in a float8 plan, so other plans keep their bytes)."""
        if self.fp8_settings is None:
            return {}
        chosen = [n for n, d in self.fp8.items() if d.rule == Rule.FP8]
        known = [self.nodes[n] for n in self.matrix_nodes() if self.nodes[n].flops is not None]
        total = sum(d.flops or 0 for d in known)
        fp8_flops = sum(self.nodes[n].flops or 0 for n in chosen if n in self.nodes)
        found: dict[str, object] = {
            "matrix_ops_fp8": len(chosen),
            "matrix_flops_fp8_share": round(fp8_flops / total, 6) if total else None,
            "scales": len(self.scales),
        }
        if self.fp8_settings.get("embeddings"):  # only then, so other plans keep their bytes
            found["tables_8bit"] = sum(d.rule == Rule.FP8_TABLE for d in self.fp8.values())
        if self.fp8_settings.get("kept_int8"):  # the same
            found["weights_int8"] = sum(
                r.format == "int8" and r.granularity == "channel" for r in self.scales
            )
        return found

    def fp8_tables(self) -> list[str]:
        """The nodes of the float8 decisions that are embedding lookups, not matrix ops
        (``Float8(embeddings=True)``: their tables stored 8-bit or kept)."""
        matrix = set(self.matrix_nodes())
        return [name for name in self.fp8 if name not in matrix]

    @property
    def version(self) -> int:
        """The plan format version this plan is written at (module constants)."""
        return FP8_PLAN_VERSION if self.fp8_settings is not None else 1

    # -- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, object]:
        """The plan as plain data, every list sorted by a stable key (see docs/plans.md);
        ``rewrites`` only where there are some."""
        data = {
            "format": PLAN_FORMAT,
            "version": self.version,
            "model": self.model,
            "dtype": self.dtype,
            "policy": self.policy,
            "summary": self.summary(),
            "nodes": {name: decision_dict(d) for name, d in sorted(self.nodes.items())},
            "casts": [
                c.to_dict()
                for c in sorted(self.all_casts(), key=lambda c: (c.tensor, c.dst, c.output))
            ],
            "casts_retargeted": dict(sorted(self.casts_retargeted.items())),
            "casts_removed": sorted(self.casts_removed),
            "weights": [
                w.to_dict() for w in sorted(self.all_weights(), key=lambda w: (w.name, w.dst))
            ],
        }
        if self.rewrites:
            data["rewrites"] = [r.to_dict() for r in sorted(self.rewrites, key=lambda r: r.node)]
        if self.fp8_settings is not None:
            data["fp8_settings"] = self.fp8_settings
            data["fp8"] = {name: d.to_dict() for name, d in sorted(self.fp8.items())}
            data["scales"] = [
                r.to_dict() for r in sorted(self.scales, key=lambda r: (r.tensor, r.format))
            ]
        return data

    def to_json(self) -> str:
        """Stable JSON with one line per node, cast and weight, so that a one-node change is a
        one-line change in ``git diff`` too."""
        data = self.to_dict()
        lines = ["{"]
        keys = list(data)
        for index, key in enumerate(keys):
            comma = "," if index < len(keys) - 1 else ""
            value = data[key]
            if key in ("nodes", "casts_retargeted", "fp8") and isinstance(value, dict) and value:
                items = [f"  {json.dumps(k)}: {_compact(v)}" for k, v in value.items()]
                lines.append(
                    f"  {json.dumps(key)}: {{\n"
                    + ",\n".join("  " + item for item in items)
                    + f"\n  }}{comma}"
                )
            elif (
                key in ("casts", "weights", "casts_removed", "rewrites", "scales")
                and isinstance(value, list)
                and value
            ):
                items = [f"    {_compact(v)}" for v in value]
                lines.append(f"  {json.dumps(key)}: [\n" + ",\n".join(items) + f"\n  ]{comma}")
            else:
                lines.append(f"  {json.dumps(key)}: {_compact(value)}{comma}")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def save(self, path: str | Path) -> None:
        write_atomic(Path(path), self.to_json().encode("utf-8"))

    @classmethod
    def from_dict(cls, data: object, *, where: str = "plan") -> Plan:
        if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
            raise GraphampError(f'{where}: not a graphamp plan (no "format": "{PLAN_FORMAT}")')
        if data.get("version") not in READABLE_VERSIONS:
            raise GraphampError(
                f"{where}: plan version {data.get('version')} is not supported "
                f"(this graphamp reads versions 1 to {PLAN_VERSION})"
            )
        if data.get("version") == 1 and "fp8_settings" in data:
            raise GraphampError(f"{where}: a version 1 plan holds no fp8_settings (version 2 does)")
        check_plan_data(data, where)
        try:
            nodes = {name: _decision(d) for name, d in data["nodes"].items()}
            casts = [CastRecord.from_dict(c) for c in data["casts"]]
            weights = [WeightRecord(**w) for w in data["weights"]]
            plan = cls(
                dtype=str(data["dtype"]),
                policy=dict(data["policy"]),
                nodes=nodes,
                casts=[c for c in casts if c.purpose == BOUNDARY],
                output_casts=[c for c in casts if c.purpose != BOUNDARY],
                weights=[w for w in weights if not w.kept],
                kept_weights=[w for w in weights if w.kept],
                casts_retargeted=dict(data.get("casts_retargeted", {})),
                casts_removed=list(data.get("casts_removed", [])),
                rewrites=[RewriteRecord.from_dict(r) for r in data.get("rewrites", [])],
                fp8_settings=dict(data["fp8_settings"]) if "fp8_settings" in data else None,
                fp8={n: Fp8Decision.from_dict(d) for n, d in data.get("fp8", {}).items()},
                scales=[ScaleRecord.from_dict(r) for r in data.get("scales", [])],
                model=str(data.get("model", "")),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise GraphampError(f"{where}: malformed plan ({type(exc).__name__}: {exc})") from None
        return plan

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
            if text.startswith("\ufeff"):  # JSON has none; json's own words name a codec
                raise GraphampError(
                    f"{path}: not a JSON plan: it starts with a UTF-8 byte order mark (BOM); "
                    "save it without one"
                )
            data = json.loads(text)
        except FileNotFoundError:
            raise GraphampError(f"{path}: plan file not found") from None
        except IsADirectoryError:
            raise GraphampError(f"{path}: is a folder, not a plan file") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise GraphampError(f"{path}: not a JSON plan: {exc}") from None
        except RecursionError:  # a hostile file: [[[[...]]]] past Python's stack
            raise GraphampError(f"{path}: not a JSON plan: nested too deeply") from None
        return cls.from_dict(data, where=str(path))

    def diff(self, other: Plan) -> PlanDiff:
        """What changed from ``self`` to ``other`` (see :class:`PlanDiff`)."""
        return PlanDiff.between(self, other)


def is_json_object(path: str | Path) -> bool:
    """Whether ``path``'s first bytes open a JSON object (a plan, or some other JSON file)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(256).lstrip().startswith(b"{")
    except OSError:
        return False


def looks_like_json(path: str | Path) -> bool:
    """Whether ``path``'s first bytes open JSON (an object or an array, after a UTF-8 BOM if
    one leads): a plan, or a damaged one, never a model (ONNX's protobuf cannot start so)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(256)
    except OSError:
        return False
    return head.removeprefix(b"\xef\xbb\xbf").lstrip().startswith((b"{", b"["))


def is_plan_file(path: str | Path) -> bool:
    """Whether ``path`` holds a plan (read from its first bytes, whatever its name)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(256)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and f'"{PLAN_FORMAT}"'.encode() in head


def _decision(data: JsonObject) -> NodeDecision:
    """A node decision from JSON, its precision and rule checked against the vocabulary."""
    fields = dict(data)
    fields["precision"] = Precision(fields["precision"])
    fields["rule"] = Rule(fields["rule"])
    return NodeDecision(**fields)


def _compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


__all__ = ["PLAN_FORMAT", "PLAN_VERSION", "CastRecord", "NodeDecision", "Plan", "PlanDiff"]
