"""The records a plan is made of: one decision per node, one record per cast and per weight.

They are plain data: a pass makes them, the plan writes them to JSON, the edit script refers to
the same objects, and a diff compares them by stable identity.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from graphamp.core.vocab import Precision, Rule

# A JSON object as a plan file holds it: plan_check has checked its fields' types before any
# from_dict reads it.
JsonObject = dict[str, Any]


@dataclass(slots=True)
class NodeDecision:
    """The precision one node computes in, and why.

    ``rule`` is a stable key (:class:`~graphamp.core.vocab.Rule`); ``reason`` is the sentence for
    people; ``via`` names the neighbour a colour spread through.
    """

    op: str
    precision: Precision
    rule: Rule
    reason: str
    via: str | None = None
    flops: int | None = None  # matrix ops with known shapes: 2 x multiply-adds
    # the module that made it, where its name does not say (torch.onnx's dynamo exporter)
    module: str | None = None


@dataclass
class CastRecord:
    """One Cast the conversion inserts: ``tensor`` converted ``src`` -> ``dst`` as ``output``."""

    tensor: str
    src: str
    dst: str
    output: str
    consumers: list[str]
    purpose: str = "precision boundary"  # or "graph output kept in its original type"
    # bytes it reads and writes per run, estimated from the value's shape (a symbolic
    # dimension counts 1); None where the shape is unknown
    bytes: int | None = None

    def to_dict(self) -> dict[str, object]:
        record: dict[str, object] = {
            "tensor": self.tensor,
            "from": self.src,
            "to": self.dst,
            "output": self.output,
            "consumers": self.consumers,
            "purpose": self.purpose,
        }
        if self.bytes is not None:
            record["bytes"] = self.bytes
        return record

    @classmethod
    def from_dict(cls, data: JsonObject) -> CastRecord:
        return cls(
            tensor=str(data["tensor"]),
            src=str(data["from"]),
            dst=str(data["to"]),
            output=str(data["output"]),
            consumers=[str(name) for name in data["consumers"]],
            purpose=str(data["purpose"]),
            bytes=int(data["bytes"]) if data.get("bytes") is not None else None,
        )


BOUNDARY = "precision boundary"


@dataclass
class WeightRecord:
    """A stored value (initializer or Constant) converted instead of cast at run time, or kept
    in its type because its values would not fit the target (``src == dst``)."""

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
    # values at float32's lowest/highest (a mask's stand-in for infinity) stored at the
    # half the target's largest magnitude instead (written only when there are some)
    at_limit: int = 0

    @property
    def kept(self) -> bool:
        return self.src == self.dst

    def to_dict(self) -> dict[str, object]:
        record = asdict(self)
        if not self.at_limit:
            del record["at_limit"]
        return record


@dataclass
class RewriteRecord:
    """A pattern of the model's ops replaced by one fused op (``node``), a decision like any
    other: ``rule`` and ``reason`` say why; ``replaces`` names the model's nodes it stands for,
    in graph order, and ``drops`` the stored values only they read (gone with them).
    ``inputs``/``outputs``/``attributes`` are what a dialect writes."""

    node: str
    op: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attributes: dict[str, float | int]
    replaces: list[str]
    rule: str
    reason: str
    drops: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: JsonObject) -> RewriteRecord:
        return cls(
            node=str(data["node"]),
            op=str(data["op"]),
            domain=str(data["domain"]),
            inputs=[str(n) for n in data["inputs"]],
            outputs=[str(n) for n in data["outputs"]],
            attributes=dict(data["attributes"]),
            replaces=[str(n) for n in data["replaces"]],
            rule=str(data["rule"]),
            reason=str(data["reason"]),
            drops=[str(n) for n in data.get("drops", [])],
        )


@dataclass
class Fp8Decision:
    """Whether one matrix op decided low computes on float8 operands, and why.

    ``precision`` is ``float8_e4m3fn`` when chosen (rule ``fp8``), else the low type the node
    keeps; ``rule`` is one of :data:`~graphamp.core.vocab.FP8_RULES`; ``operands`` names the
    GEMM's A and B values (what the scale records of a chosen node are about)."""

    precision: Precision
    rule: Rule
    reason: str
    operands: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "precision": str(self.precision),
            "rule": str(self.rule),
            "reason": self.reason,
            "operands": list(self.operands),
        }

    @classmethod
    def from_dict(cls, data: JsonObject) -> Fp8Decision:
        return cls(
            precision=Precision(data["precision"]),
            rule=Rule(data["rule"]),
            reason=str(data["reason"]),
            operands=[str(n) for n in data.get("operands", [])],
        )


SCALE_FORMATS = ("e4m3fn", "e5m2", "int8")  # int8: an embedding table's rows (passes/fp8.py)
SCALE_GRANULARITIES = ("tensor", "row", "channel")
SCALE_SOURCES = ("calibration", "current", "delayed", "weight")


@dataclass
class ScaleRecord:
    """One value quantised to float8 and where its scale comes from.

    ``source``: ``calibration`` (max |x| over calibration batches: ``detail`` holds
    ``batches`` and ``amax``), ``current`` (this step's amax), ``delayed`` (an amax history:
    ``history``, ``algorithm``, ``margin``) or ``weight`` (a stored value's, at conversion).
    ``consumers`` are the float8 matrix ops reading it; ``state`` the state values that carry
    its scale between steps (delayed scaling's history and scale). Diffs and checks compare
    the source and granularity, not the values in ``detail``."""

    tensor: str
    format: str
    granularity: str
    source: str
    detail: dict[str, object] = field(default_factory=dict)
    consumers: list[str] = field(default_factory=list)
    state: list[str] = field(default_factory=list)

    def key(self) -> tuple[str, str]:
        return (self.tensor, self.format)

    def describe(self) -> str:
        """One phrase naming the scale's source: what ``explain`` prints."""
        detail = self.detail
        if self.source == "calibration":
            amax = detail.get("amax")
            what = "calibration: max |x|" + (
                f" = {amax:.6g}" if isinstance(amax, int | float) else ""
            )
            batches = detail.get("batches")
            if batches is not None:
                what += f" on {batches} batch{'es' if batches != 1 else ''}"
        elif self.source == "delayed":
            what = (
                f"delayed: history {detail.get('history')}, {detail.get('algorithm')}, "
                f"margin {detail.get('margin')}"
            )
        elif self.source == "current":
            what = "current: this step's amax"
        else:
            what = "weight: at conversion"
        return f"{self.format} per {self.granularity}, {what}"

    def to_dict(self) -> dict[str, object]:
        return {
            "tensor": self.tensor,
            "format": self.format,
            "granularity": self.granularity,
            "source": self.source,
            "detail": dict(sorted(self.detail.items())),
            "consumers": list(self.consumers),
            "state": list(self.state),
        }

    @classmethod
    def from_dict(cls, data: JsonObject) -> ScaleRecord:
        return cls(
            tensor=str(data["tensor"]),
            format=str(data["format"]),
            granularity=str(data["granularity"]),
            source=str(data["source"]),
            detail=dict(data.get("detail", {})),
            consumers=[str(n) for n in data.get("consumers", [])],
            state=[str(n) for n in data.get("state", [])],
        )


def decision_dict(decision: NodeDecision) -> dict[str, object]:
    """A decision as the plan file writes it: fields that are None are left out."""
    return {key: value for key, value in asdict(decision).items() if value is not None}


class PlanRecords(Protocol):
    """What a plan holds, as a diff reads it (:class:`~graphamp.plans.plan.Plan` is one): so
    that :mod:`graphamp.plans.plandiff` needs only the records, and the plan module (which
    offers ``Plan.diff``) can import the diff without an import circle."""

    model: str
    dtype: str
    nodes: dict[str, NodeDecision]
    fp8_settings: dict[str, object] | None
    fp8: dict[str, Fp8Decision]
    scales: list[ScaleRecord]

    def all_casts(self) -> list[CastRecord]: ...

    def all_weights(self) -> list[WeightRecord]: ...

    def summary(self) -> dict[str, object]: ...

    def to_dict(self) -> dict[str, object]: ...

    def to_json(self) -> str: ...
