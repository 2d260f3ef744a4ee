"""Float8: the settings of graphamp's float8 tier (plain data, no torch at import).

Float8 is an overlay on the low type: matrix ops already decided float16/bfloat16 get float8
operands where the rules of :mod:`graphamp.passes.fp8` allow, everything else keeps its
precision. Three recipes, as Transformer Engine and torchao name them:

* ``Float8.current(granularity="tensor" | "row")``: each step's (or run's) own amax, HYBRID
  formats (E4M3 forward operands, E5M2 gradients): torchao's TENSORWISE / ROWWISE recipes;
* ``Float8.delayed(history=1024, algorithm="max" | "most_recent", margin=0)``: Transformer
  Engine's ``DelayedScaling``: the scale from an amax history of earlier steps;
* ``Float8.static(margin=1)``: scales fixed from calibration data (what ``graphamp convert
  --fp8 --calibrate DATA`` and ``graphamp.fx.convert(..., calibrate=...)`` use): an
  activation's scale is max|x| * 2**margin / 448, weights get one scale per output channel
  (max|w| / 448) at conversion. The margin of one binade is the ``range`` rule's margin for
  float16, for the same reason: calibration data are a sample, and a larger value would
  saturate at +-448. It costs float8 almost nothing: E4M3's relative precision is the same in
  every binade above 2**-6, so the headroom moves only the smallest values into subnormals.

Fields every recipe shares: ``deny_names`` (globs on node names and module paths kept out of
float8), ``keep_last`` (keep the last matrix op, the LM head or output layer), ``sizes`` (which
size table keeps small products out: ``"torchao"`` is torchao's auto-filter for the recipe's
granularity, ``"none"`` keeps only the multiple-of-16 rule) and ``max_underflow`` (the share of
an operand's non-zero calibrated values that may flush to zero at its scale before the node
keeps the low type).

``embeddings`` (off by default; static recipe only, what ``convert --fp8-embeddings`` sets) also
stores each embedding table (a Gather's stored data) in 8 bits: int8 with one scale per row (max
|row| / 127), the Gather reading the int8 table and the scale vector and the gathered rows
multiplied back to the low type (a position table an Add adds to a lookup, folded to a constant
by the exporter, the same way, read through a DequantizeLinear). Not float8: ONNX's Gather takes
no float8 tensor at any opset, so a float8 table would need a DequantizeLinear of the whole
table before the Gather on every run; and int8's uniform grid is about 3x closer than E4M3's to
a row of normally distributed values at the same bytes (relative RMS error 0.8% against 2.6%).

``kept_int8`` (off by default; static recipe only, what ``convert --fp8 --fp8-kept-int8`` sets)
stores the weight of each matrix product the rules keep out of float8 for its shape, its place
(the last matrix op), its range or tuning as int8 too, with one scale per output channel
(max |w| / 127), a ``DequantizeLinear`` giving the product its weight in the low type: a
weight-only 8-bit product. The product still computes in the low type on an unquantised
activation, so it keeps what float8 would cost there (the activation's E4M3 rounding, the
reason it was kept) and halves its weight's bytes at about a third of E4M3's weight error.
Products kept by a deny name or as a MoE router keep their weight in the low type: a rule the
user or the router's ordering asked for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from graphamp.errors import GraphampError

RECIPES = ("current", "delayed", "static")
GRANULARITIES = ("tensor", "row")
ALGORITHMS = ("max", "most_recent")
SIZE_TABLES = ("torchao", "none")
E4M3_MAX = 448.0  # the largest float8_e4m3fn value
E5M2_MAX = 57344.0  # the largest float8_e5m2 value


@dataclass(frozen=True)
class Float8:
    """How float8 matrix products are scaled and which ones are kept out (module docstring).

    Make one with :meth:`current`, :meth:`delayed` or :meth:`static`; the fields are checked
    on construction (a bad value is a :class:`~graphamp.errors.GraphampError` naming it).
    """

    recipe: str = "current"
    granularity: str = "tensor"
    history: int = 1024  # delayed: amax history length
    algorithm: str = "max"  # delayed: how the history gives the amax
    margin: int = 0  # delayed and static: the scale leaves 2**margin of headroom above amax
    deny_names: tuple[str, ...] = ()
    keep_last: bool = True
    sizes: str = "torchao"
    max_underflow: float = 0.01
    embeddings: bool = False  # static: embedding tables stored int8 per row (docstring)
    kept_int8: bool = False  # static: kept products' weights stored int8 per channel
    extra: Mapping[str, Any] = field(default_factory=dict)  # settings a dialect adds

    def __post_init__(self) -> None:
        _one_of("recipe", self.recipe, RECIPES)
        _one_of("granularity", self.granularity, GRANULARITIES)
        _one_of("algorithm", self.algorithm, ALGORITHMS)
        _one_of("sizes", self.sizes, SIZE_TABLES)
        _whole("history", self.history, 1)
        _whole("margin", self.margin, 0)
        if not (isinstance(self.max_underflow, int | float) and 0 <= self.max_underflow <= 1):
            raise GraphampError(
                f"Float8: max_underflow must be a share between 0 and 1, not {self.max_underflow!r}"
            )
        if not isinstance(self.keep_last, bool):  # 'no' is true: it would keep the last layer
            raise GraphampError(f"Float8: keep_last must be True or False, not {self.keep_last!r}")
        if isinstance(self.deny_names, str) or not all(isinstance(n, str) for n in self.deny_names):
            raise GraphampError("Float8: deny_names must be a sequence of glob strings")
        object.__setattr__(self, "deny_names", tuple(self.deny_names))
        for name, what in (("embeddings", "tables"), ("kept_int8", "kept products' weights")):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise GraphampError(f"Float8: {name} must be True or False, not {value!r}")
            if value and self.recipe != "static":
                raise GraphampError(
                    f"Float8: {name}=True stores {what} at conversion: the static recipe only "
                    f"(Float8.static({name}=True))"
                )
        if self.recipe == "static" and self.granularity != "tensor":
            raise GraphampError(
                "Float8.static: activations take one scale per tensor (granularity 'tensor'); "
                "weights take one per output channel"
            )

    # -- the recipes -------------------------------------------------------------------------

    @classmethod
    def current(cls, granularity: str = "tensor", **shared: Any) -> Float8:
        """Current scaling: each step's own amax (torchao's TENSORWISE or ROWWISE)."""
        return cls(recipe="current", granularity=granularity, **shared)

    @classmethod
    def delayed(
        cls, history: int = 1024, algorithm: str = "max", margin: int = 0, **shared: Any
    ) -> Float8:
        """Delayed scaling with Transformer Engine's semantics (module docstring)."""
        return cls(recipe="delayed", history=history, algorithm=algorithm, margin=margin, **shared)

    @classmethod
    def static(cls, margin: int = 1, **shared: Any) -> Float8:
        """Scales fixed from calibration data (module docstring); no size table by default: a
        deployed model gains float8's halved weight bytes whatever the product's size."""
        shared.setdefault("sizes", "none")
        return cls(recipe="static", margin=margin, **shared)

    # -- what the passes read ----------------------------------------------------------------

    def source(self) -> str:
        """The scale source of an activation operand: ``calibration``, ``current`` or
        ``delayed`` (a plan's scale record)."""
        return "calibration" if self.recipe == "static" else self.recipe

    def source_detail(self) -> dict[str, object]:
        """The settings a scale record names besides its source (delayed: the history;
        static: the margin)."""
        if self.recipe == "delayed":
            return {"history": self.history, "algorithm": self.algorithm, "margin": self.margin}
        if self.recipe == "static":
            return {"margin": self.margin}
        return {}

    def scale_of(self, amax: float) -> float:
        """The static scale of a value whose largest magnitude is ``amax``: amax * 2**margin
        / 448 (a quantised value is x / scale), 1 where amax is 0 or not finite."""
        return scale_of(amax, self.margin)

    def describe(self) -> str:
        if self.recipe == "delayed":
            return (
                f"float8 delayed scaling (history {self.history}, {self.algorithm}, margin "
                f"{self.margin})"
            )
        if self.recipe == "static":
            return "float8 static scaling (calibrated activations per tensor, weights per channel)"
        return f"float8 current scaling ({self.granularity}wise)"

    # -- the plan's record -------------------------------------------------------------------

    def to_dict(self) -> dict[str, object]:
        """The settings as a plan records them (stable keys, only what applies)."""
        data: dict[str, object] = {"recipe": self.recipe, "granularity": self.granularity}
        data.update(self.source_detail())
        data.update(
            deny_names=list(self.deny_names),
            keep_last=self.keep_last,
            sizes=self.sizes,
            max_underflow=self.max_underflow,
        )
        if self.embeddings:  # written only when on: plans made without it keep their bytes
            data["embeddings"] = True
        if self.kept_int8:  # the same
            data["kept_int8"] = True
        if self.extra:
            data["extra"] = dict(sorted(self.extra.items()))
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object], *, where: str = "fp8 settings") -> Float8:
        known = {
            "recipe", "granularity", "history", "algorithm", "margin", "deny_names",
            "keep_last", "sizes", "max_underflow", "embeddings", "kept_int8", "extra",
        }  # fmt: skip
        unknown = sorted(set(data) - known)
        if unknown:
            raise GraphampError(f"{where}: unknown float8 setting {unknown[0]!r}")
        fields: dict[str, Any] = dict(data)  # each checked by the constructor
        if "deny_names" in fields:
            fields["deny_names"] = tuple(fields["deny_names"])
        try:
            return cls(**fields)
        except TypeError as exc:
            raise GraphampError(f"{where}: {exc}") from None


def scale_of(amax: float, margin: int = 0) -> float:
    """amax * 2**margin / 448, the scale that maps amax (with the margin's headroom) to
    float8_e4m3fn's largest value; 1 where amax is 0 or not finite."""
    if not math.isfinite(amax) or amax <= 0:
        return 1.0
    return amax * 2.0**margin / E4M3_MAX


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise GraphampError(
            f"Float8: {name} must be one of {', '.join(map(repr, allowed))}, not {value!r}"
        )


def _whole(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise GraphampError(f"Float8: {name} must be a whole number >= {least}, not {value!r}")
