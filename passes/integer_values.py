"""integer_values: integers carried in float values stay exact.

Quantised models (onnxruntime's ``quantize_dynamic``: ConvInteger and MatMulInteger between
DynamicQuantizeLinear nodes) and audio front ends compute integers in float: an int32
accumulator cast to float and scaled, a zero point ``Floor((0 - min) / scale)``, a frame count
``Floor((samples - n_fft) / hop) + 1``. The low type holds neither their range nor, past a few
thousand, every integer. Two rules, applied after classify to the ops classify would let run
low (allow, allow_names, infer, clear; under ``spread = "all"`` unlisted ops too), each with
its rule and reason in the plan:

1. ``integer_range``: a Cast already in the model from an integer type whose values can leave
   the low type's range (for float16: int32, int64, uint16, uint32, uint64; bfloat16 holds
   them all) to float32 keeps producing float32 (it is not retargeted), and every op that
   reads its output in a computation-type slot stays float32: in the low type the value would
   overflow on its way in, whether the Cast or a Cast before the op made it low. The values
   keep their magnitude through ops that move or add them (clear-list ops, the boundaries of
   bodies, Add, Sub, Neg, Abs, Max, Min, Sum): their readers are held the same way. Once an
   op scales them (MatMulInteger's output times its scales), its output is an ordinary value.
   Calibrated ranges (``Options.ranges``) that show the Cast's output within the range
   rule's limit lift the rule for that Cast.
2. ``integer_valued``: float arithmetic whose result is used as an integer stays float32,
   unless its range is known to be exact in the low type (every integer up to 2048 for
   float16, 256 for bfloat16). A value is used as an integer where it feeds Floor, Ceil or
   Round, a Cast to an integer type, a count, size or index input (Range's, OneHot's,
   Resize's scales), or a quantiser whose integers the low type cannot all hold (a
   QuantizeLinear to int16: an 8-bit quantiser's 256 steps are exact in both low types). The
   arithmetic is the op that produces the value and, walking back along computation-type
   inputs, every infer or clear op before it (a rounding op or a quantiser reading the value
   is held too). The walk passes through ops already float32 and stops at a Cast, a stored
   value, a graph input, an op whose output type is not its computation type, and an allow
   op (a matrix product or convolution is put low on purpose; walking through it would take
   the whole network). Calibrated ranges that show the used value within the exact limit lift
   the rule for that use (not for a quantiser: its integers are ``x / scale``).

Neither rule spreads deny; the casts pass then casts where the neighbours are low, as for a
``range`` op.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from graphamp.core.dtypes import BY_NAME, FLOAT_TYPES, numpy_type
from graphamp.core.graph import NodeKind, OpGraph, OpNode
from graphamp.core.vocab import Precision, Rule
from graphamp.numerics.ranges import Ranges, limit
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.passes.numerics import overflow_threshold
from graphamp.plans.records import NodeDecision

# The classes the rules override: those that may end low (under ``spread = "all"`` an unlisted
# op too). A node already float32 for a reason of its own keeps that reason.
_LOWERABLE = frozenset({Rule.ALLOW, Rule.ALLOW_NAME, Rule.INFER, Rule.CLEAR})
# What the walk of rule 2 holds and walks through (allow ops are low on purpose: it stops there)
_ARITHMETIC = frozenset({Rule.INFER, Rule.CLEAR})

# Ops (ONNX's names and aten's) that round their input to an integer.
ROUNDING = frozenset({"Floor", "Ceil", "Round", "floor", "ceil", "round", "trunc"})
# Ops whose float inputs at these slots are a count, a size or an index.
COUNT_SLOTS: dict[str, tuple[int, ...]] = {
    "Range": (0, 1, 2),
    "OneHot": (0, 1),
    "Resize": (2,),
    "Upsample": (1,),
}
QUANTISERS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear", "com.microsoft.QuantizeLinear"})
# Ops through which a value keeps (at least) the magnitude it had: the readers of their outputs
# are held by rule 1 as the readers of the Cast's output are.
_KEEPS_MAGNITUDE = frozenset(
    {"Add", "Sub", "Neg", "Abs", "Max", "Min", "Sum", "add", "sub", "neg", "abs"}
    | {"maximum", "minimum"}
)
_INTEGERS = frozenset({"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"})


def exact_limit(low: str) -> int:
    """The largest magnitude up to which ``low`` holds every integer (float16: 2048)."""
    return int(2 ** (int(ml_dtypes.finfo(numpy_type(low)).nmant) + 1))


def integer_max(dtype: str) -> int:
    """The largest magnitude an integer type holds."""
    info = np.iinfo(BY_NAME[dtype].numpy)
    return max(int(info.max), -int(info.min))


class IntegerValuesPass(Pass):
    """Keep integer values carried in float exact (module docstring)."""

    name = "integer_values"
    requires = frozenset({Fact.CLASSIFIED})

    def run(self, context: PassContext) -> PassResult:
        rules = _Rules(context)
        for node in context.graph:
            if node.kind is NodeKind.CAST:
                rules.wide_integer_cast(node)
        for node in context.graph:
            rules.integer_uses(node)
        return PassResult(
            modified=False,
            note=f"{rules.held[Rule.INTEGER_RANGE]} ops held by integer_range, "
            f"{rules.held[Rule.INTEGER_VALUED]} by integer_valued",
        )


class _Rules:
    """The two rules over one graph (module docstring); ``held`` counts the ops each keeps."""

    def __init__(self, context: PassContext) -> None:
        self.graph: OpGraph = context.graph
        self.decisions = context.decisions
        self.low = context.policy.dtype
        self.ranges: Ranges | None = context.options.ranges
        self.held = {Rule.INTEGER_RANGE: 0, Rule.INTEGER_VALUED: 0}
        every = context.policy.spread == "all"  # which runs unlisted ops low too
        self.lowerable = _LOWERABLE | {Rule.UNLISTED} if every else _LOWERABLE
        self.arithmetic = _ARITHMETIC | {Rule.UNLISTED} if every else _ARITHMETIC
        self.walked: set[str] = set()  # values rule 2 has walked back from

    # rule 1 ----------------------------------------------------------------------------------

    def wide_integer_cast(self, cast: OpNode) -> None:
        """Rule 1 for one of the model's Casts."""
        graph, low = self.graph, self.low
        if not cast.inputs or not cast.inputs[0] or cast.cast_to != "float32":
            return
        source = graph.tensors[cast.inputs[0]].dtype
        if source not in _INTEGERS or integer_max(source) < overflow_threshold(low):
            return
        output = cast.outputs[0]
        largest = f"{integer_max(source):,}"
        if self._calibrated(output, limit(low)):
            return
        past = f"past {low}'s largest {float(ml_dtypes.finfo(numpy_type(low)).max):g}"
        self._hold(
            cast.name,
            Rule.INTEGER_RANGE,
            f"Cast from {source} already in the model: {source} values reach {largest}, {past},"
            " so it keeps producing float32 and its readers read float32 (calibration data"
            " can show the values fit)",
            precision=Precision.NONE,
        )
        reason = (
            f"reads {output!r}, {source} values cast to float (Cast {cast.name!r}) that reach "
            f"{largest}, {past}: kept float32 rather than overflow on the way in"
        )
        values, seen = [output], {output}
        while values:
            value = values.pop()
            for reader, slot in graph.consumers(value):
                node = graph.nodes[reader]
                if slot < 0 or slot not in node.follow_inputs:
                    continue
                keeps = self._keeps_magnitude(node)  # (asked before the hold replaces its rule)
                self._hold(reader, Rule.INTEGER_RANGE, reason)
                if not keeps:
                    continue
                for index in sorted(node.follow_outputs):
                    passed = node.outputs[index]
                    if passed and passed not in seen:
                        seen.add(passed)
                        values.append(passed)

    def _keeps_magnitude(self, node: OpNode) -> bool:
        rule = self.decisions[node.name].rule
        return node.op in _KEEPS_MAGNITUDE or node.kind is NodeKind.BOUNDARY or rule is Rule.CLEAR

    # rule 2 ----------------------------------------------------------------------------------

    def integer_uses(self, node: OpNode) -> None:
        """Rule 2 for the values ``node`` uses as integers."""
        for slot, what in self._uses(node):
            value = node.inputs[slot] if slot < len(node.inputs) else ""
            tensor = self.graph.tensors.get(value) if value else None
            if tensor is None or tensor.dtype not in FLOAT_TYPES:
                continue
            exact = exact_limit(self.low)
            if node.op in QUANTISERS:
                known = ""  # its integers are x / scale: the range of x does not tell
            else:
                found = self.ranges.tensors.get(value) if self.ranges is not None else None
                if found is not None and found.nonfinite == 0 and found.max_abs <= exact:
                    continue
                known = (
                    " (no calibrated range shows it stays there)"
                    if found is None
                    else f" (it reaches |x| = {found.max_abs:.6g} on the calibration data)"
                )
            reason = (
                f"integer-valued arithmetic: its result reaches {what} {node.name!r}, which"
                f" uses it as an integer, and {self.low} holds integers exactly only up to"
                f" {exact}{known}: kept float32"
            )
            if slot in node.follow_inputs:  # the reader computes on it: held with it
                self._hold(node.name, Rule.INTEGER_VALUED, reason)
            self._walk_back(value, reason)

    def _uses(self, node: OpNode) -> list[tuple[int, str]]:
        """(slot, what reads it) for each input ``node`` uses as an integer."""
        if node.kind is NodeKind.CAST:
            if node.cast_to in _INTEGERS:
                return [(0, f"a Cast to {node.cast_to}")]
            return []
        if node.op in ROUNDING:
            return [(0, node.op)]
        if node.op in COUNT_SLOTS:
            return [(slot, f"the count input {slot} of {node.op}") for slot in COUNT_SLOTS[node.op]]
        if node.op in QUANTISERS and node.outputs and node.outputs[0]:
            integers = self.graph.tensors[node.outputs[0]].dtype
            if integers in _INTEGERS and integer_max(integers) > exact_limit(self.low):
                return [(0, f"{node.op} to {integers}")]
        return []

    def _walk_back(self, start: str, reason: str) -> None:
        """Hold the infer and clear ops that compute ``start`` (module docstring, rule 2)."""
        graph = self.graph
        values = [start]
        while values:
            value = values.pop()
            if value in self.walked:
                continue
            self.walked.add(value)
            tensor = graph.tensors.get(value)
            if tensor is None or tensor.producer is None:
                continue
            node = graph.nodes[tensor.producer]
            if node.kind not in (NodeKind.OP, NodeKind.BOUNDARY):
                continue
            if not any(node.outputs[slot] == value for slot in node.follow_outputs):
                continue  # written in a type of its own (a quantiser's scale)
            rule = self.decisions[node.name].rule
            if rule in self.arithmetic:
                self._hold(node.name, Rule.INTEGER_VALUED, reason)
            elif rule in self.lowerable or self.decisions[node.name].precision != Precision.FLOAT32:
                continue  # an allow op (low on purpose), or one that already runs low
            values.extend(
                node.inputs[slot]
                for slot in sorted(node.follow_inputs)
                if slot < len(node.inputs) and node.inputs[slot]
            )

    # both ------------------------------------------------------------------------------------

    def _calibrated(self, value: str, bound: float) -> bool:
        """Whether calibrated ranges show ``value`` within ``bound``."""
        found = self.ranges.tensors.get(value) if self.ranges is not None else None
        return found is not None and found.nonfinite == 0 and found.max_abs <= bound

    def _hold(
        self, name: str, rule: Rule, reason: str, precision: Precision = Precision.FLOAT32
    ) -> None:
        decision = self.decisions[name]
        if precision is Precision.FLOAT32 and decision.rule not in self.lowerable:
            return
        if precision is Precision.NONE and decision.rule is not Rule.CAST:
            return
        self.decisions[name] = NodeDecision(
            op=decision.op, precision=precision, rule=rule, reason=reason, flops=decision.flops
        )
        self.held[rule] += precision is Precision.FLOAT32
