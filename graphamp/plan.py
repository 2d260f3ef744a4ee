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
from typing import Any

from graphamp.errors import GraphampError

PLAN_FORMAT = "graphamp-plan"
PLAN_VERSION = 1

# Op types whose FLOPs the summary counts as "matrix work".
MATRIX_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"})


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


@dataclass
class Edits:
    """Slot-level changes, in the order a dialect should apply them."""

    retype: dict[str, str] = field(default_factory=dict)  # tensor -> new dtype
    # (node, input slot) -> tensor it reads instead (a cast output, a weight copy, a source)
    rewire: dict[tuple[str, int], str] = field(default_factory=dict)
    casts: list[CastRecord] = field(default_factory=list)
    output_casts: list[CastRecord] = field(default_factory=list)  # keep_io_types outputs
    weights: list[WeightRecord] = field(default_factory=list)
    retarget_casts: dict[str, str] = field(default_factory=dict)  # Cast node -> new target
    remove_nodes: list[str] = field(default_factory=list)  # pre-existing Casts made redundant
    # (weight, dtype) -> its converted values, computed once by the casts pass for the dialect
    converted: dict[tuple[str, str], Any] = field(default_factory=dict, repr=False)


@dataclass
class Plan:
    """Decisions for one graph under one policy."""

    dtype: str
    policy: dict[str, object]
    nodes: dict[str, NodeDecision] = field(default_factory=dict)
    edits: Edits = field(default_factory=Edits)
    model: str = ""
    # FLOPs per node where shapes are known (matrix ops only), for the summary.
    flops: dict[str, int] = field(default_factory=dict)

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
        known = [n for n in matrix if n in self.flops]
        total_flops = sum(self.flops[n] for n in known)
        low_flops = sum(self.flops[n] for n in known if self.nodes[n].precision == self.dtype)
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
        }

    # -- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, object]:
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
                asdict(c)
                for c in sorted(edits.casts + edits.output_casts, key=lambda c: (c.tensor, c.dst))
            ],
            "casts_retargeted": dict(sorted(edits.retarget_casts.items())),
            "casts_removed": sorted(edits.remove_nodes),
            "weights": [asdict(w) for w in sorted(edits.weights, key=lambda w: (w.name, w.dst))],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n"

    def save(self, path: str | Path) -> None:
        from graphamp.io import write_atomic  # local: plan.py stays import-light

        write_atomic(Path(path), self.to_json().encode("utf-8"))

    @classmethod
    def from_dict(cls, data: dict[str, object], *, where: str = "plan") -> Plan:
        if data.get("format") != PLAN_FORMAT:
            raise GraphampError(f'{where}: not a graphamp plan (no "format": "{PLAN_FORMAT}")')
        if data.get("version") != PLAN_VERSION:
            raise GraphampError(f"{where}: plan version {data.get('version')} is not supported")
        nodes = {name: NodeDecision(**d) for name, d in data["nodes"].items()}  # type: ignore[union-attr]
        casts = [CastRecord(**c) for c in data["casts"]]  # type: ignore[union-attr]
        weights = [WeightRecord(**w) for w in data["weights"]]  # type: ignore[union-attr]
        edits = Edits(
            casts=[c for c in casts if c.purpose == "precision boundary"],
            output_casts=[c for c in casts if c.purpose != "precision boundary"],
            weights=weights,
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


def _drop_none(record: dict[str, object]) -> dict[str, object]:
    return {key: value for key, value in record.items() if value is not None}
