"""saturation: let a deny-list ``Pow`` run low where its overflow can only saturate a Tanh.

The tanh approximation of GELU (GPT-2, BLOOM, Gemma, Phi; exporters write it out as
``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``) cubes its input: in float16 that
overflows for |x| > 40, which is why ``Pow`` is on the deny list. Here the overflow is
harmless: ``x**3`` becomes +-inf with the sign of ``x``, scaling by a finite non-zero constant
and adding the finite ``x`` keep it +-inf of that sign (no inf - inf, no 0 * inf), and Tanh
maps it to +-1, which is what it gives the large finite value in float32. So a ``Pow`` whose
only way out is such a chain into a saturating op becomes ``infer`` (it follows its
neighbours, which run low), with a reason that says why; onnxruntime's float16 tool runs the
same chain in float16 without asking.

The chain from the ``Pow`` output to the saturating op (Tanh, Sigmoid, Erf) may hold ``Mul``
and ``Add`` of stored scalar constants and ``Add`` of the ``Pow``'s own base; every value on it
has exactly one reader and is no graph output. It computes a x**n + b x + c, and the ``Pow``
goes low only where that is proven to saturate in float32 too, on the side the overflow goes,
for every |x| from where x**n overflows the low type to its largest (:func:`saturates_alike`):
a small coefficient, an offset that flips the sign, a coefficient that flushes to zero in the
low type (0 * inf) all keep it denied. A ``Pow`` the user named in a list keeps the user's
choice. ONNX graphs only (a traced module's GELU is one op).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from graphamp.core.dtypes import numpy_type
from graphamp.core.graph import OpGraph, OpNode
from graphamp.core.vocab import Precision, Rule
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.passes.numerics import overflow_threshold
from graphamp.plans.records import NodeDecision

SATURATING = frozenset({"Tanh", "Sigmoid", "Erf"})
_LONGEST_CHAIN = 8  # tanh-GELU needs 3 (Mul, Add, Mul): room for reordered exports


class SaturationPass(Pass):
    """Move saturating ``Pow`` nodes from deny to infer (see the module docstring)."""

    name = "saturation"
    requires = frozenset({Fact.CLASSIFIED})
    dialect = "onnx"  # ONNX's Pow and Tanh, and what its exporters write for tanh-GELU

    def applies(self, context: PassContext) -> bool:
        return "Pow" not in context.policy.moved_ops

    def run(self, context: PassContext) -> PassResult:
        moved = 0
        for node in context.graph:
            decision = context.decisions[node.name]
            if node.op != "Pow" or node.domain or decision.rule is not Rule.DENY:
                continue
            end = saturating_end(context.graph, node, context.policy.dtype)
            if end is None:
                continue
            context.decisions[node.name] = NodeDecision(
                op=node.op,
                precision=Precision.FLOAT32,  # provisional, as for every infer op
                rule=Rule.INFER,
                reason=(
                    f"Pow is on the deny list, but its only way out is {end}: an overflow is +-inf"
                    " that the saturating op maps to +-1 as float32 would (tanh-GELU's x**3)"
                ),
            )
            moved += 1
        return PassResult(modified=False, note=f"{moved} Pow ops whose overflow saturates")


def saturating_end(graph: OpGraph, power: OpNode, low: str) -> str | None:
    """The name of the saturating node ``power``'s output reaches through a chain of scalar
    Mul/Add (module docstring) on which every overflow of the cube saturates as in float32, or
    None."""
    exponent = _scalar(graph, power.inputs[1]) if len(power.inputs) == 2 else None
    if exponent is None:
        return None
    base, value = power.inputs[0], power.outputs[0]
    steps: list[tuple[str, float | None]] = []  # (Mul or Add, the constant; None: the base)
    for _ in range(_LONGEST_CHAIN):
        tensor = graph.tensors.get(value)
        readers = graph.consumers(value)
        if tensor is None or tensor.is_graph_output or len(readers) != 1:
            return None
        reader = graph.nodes[readers[0][0]]
        if reader.domain:
            return None
        if reader.op in SATURATING:
            agrees = saturates_alike(exponent, steps, reader.op, low)
            return reader.name if agrees else None
        if len(reader.inputs) != 2 or reader.op not in ("Mul", "Add"):
            return None
        other = reader.inputs[1 - readers[0][1]]
        if reader.op == "Add" and other == base:
            steps.append(("Add", None))
        else:
            constant = _scalar(graph, other)
            if constant is None:
                return None
            steps.append((reader.op, constant))
        value = reader.outputs[0]
    return None


# How far past zero the argument must be for the saturating op to be within 1e-2 of its limit
# (tanh(2.65), erf(1.83) and sigmoid(4.6) are): the float32 model must saturate as well.
_SATURATED_FROM = {"Tanh": 2.65, "Erf": 1.83, "Sigmoid": 4.6}


def saturates_alike(
    exponent: float, steps: list[tuple[str, float | None]], op: str, low: str
) -> bool:
    """Whether, wherever the power overflows ``low``, float32 also saturates ``op`` on the side
    the overflow goes to. The chain computes v(x) = a x**n + b x + c (Mul scales, Add of a
    constant shifts, Add of the base adds x); in ``low`` an overflow makes it inf of a known
    sign, so the check is that float32's v(x) lies beyond the saturation point on that side
    for every |x| from where x**n overflows up to the type's largest: a minimum of a x**n + b x
    on an interval, at its ends or at its one turning point. A Mul constant that rounds to zero
    in ``low`` (0 * inf is NaN) fails; so does a fractional power of a negative number."""
    limit = overflow_threshold(low)
    if not 1 < exponent <= 8:  # (beyond, a power of float16's largest leaves float64's range)
        return False
    a, b, c, direction = 1.0, 0.0, 0.0, 1.0
    for step, constant in steps:
        if step == "Add":
            if constant is None:
                b += 1.0
            else:
                c += constant
            continue
        assert constant is not None
        if float(np.asarray(constant, np.float32).astype(numpy_type(low))) == 0.0:
            return False  # flushes to zero in the low type: 0 * inf
        a, b, c = a * constant, b * constant, c * constant
        direction *= math.copysign(1.0, constant)
    start = limit ** (1.0 / exponent)  # |x| from which x**n overflows
    largest = float(ml_dtypes.finfo(numpy_type(low)).max)
    signs = (1.0, -1.0) if float(exponent).is_integer() else (1.0,)
    for sign in signs:
        power_sign = sign ** int(exponent) if float(exponent).is_integer() else 1.0
        side = direction * power_sign  # the sign of the overflowed chain in the low type
        # g(u) = side * v(sign * u) = A u**n + B u + C on u in [start, largest]
        big, small, constant = side * a * power_sign, side * b * sign, side * c
        candidates = [start, largest]
        if big * small < 0:
            turning = (-small / (exponent * big)) ** (1.0 / (exponent - 1.0))
            if start < turning < largest:
                candidates.append(turning)
        lowest = min(big * u**exponent + small * u + constant for u in candidates)
        if not lowest >= _SATURATED_FROM[op]:
            return False
    return True


def _scalar(graph: OpGraph, name: str) -> float | None:
    """The value of ``name`` when it is a stored scalar (one element, not an overridable
    input) that is finite; None otherwise."""
    tensor = graph.tensors.get(name)
    if tensor is None or not tensor.is_constant or tensor.is_graph_input:
        return None
    values = np.asarray(tensor.stored_value())
    if values.size != 1 or not np.issubdtype(values.dtype, np.floating):
        return None
    value = float(values.reshape(-1)[0])
    return value if math.isfinite(value) else None
