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
by a stored constant whose values are all finite and non-zero, and ``Add`` of a stored finite
constant or of the ``Pow``'s own base; every value on it has exactly one reader and is no graph
output. Anything else (a second reader, a Div, a Sub of another variable) and the ``Pow``
stays denied. A ``Pow`` the user named in a list keeps the user's choice. ONNX graphs only (a
traced module's GELU is one op).
"""

from __future__ import annotations

import numpy as np

from graphamp.graph import OpGraph, OpNode
from graphamp.passes.base import Fact, Pass, PassContext, PassResult, register
from graphamp.records import NodeDecision
from graphamp.vocab import Precision, Rule

SATURATING = frozenset({"Tanh", "Sigmoid", "Erf"})
_LONGEST_CHAIN = 8  # tanh-GELU needs 3 (Mul, Add, Mul): room for reordered exports


@register
class SaturationPass(Pass):
    """Move saturating ``Pow`` nodes from deny to infer (see the module docstring)."""

    name = "saturation"
    requires = frozenset({Fact.CLASSIFIED})
    after = ("classify",)
    before = ("range", "paint", "promote")

    def applies(self, context: PassContext) -> bool:
        return (
            context.policy.dialect == "onnx"
            and "Pow" not in context.policy.moved_ops
            and Fact.DECIDED not in context.facts
        )

    def run(self, context: PassContext) -> PassResult:
        moved = 0
        for node in context.graph:
            decision = context.decisions[node.name]
            if node.op != "Pow" or node.domain or decision.rule is not Rule.DENY:
                continue
            end = saturating_end(context.graph, node)
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


def saturating_end(graph: OpGraph, power: OpNode) -> str | None:
    """The name of the saturating node ``power``'s output reaches through a safe chain (module
    docstring), or None."""
    if len(power.inputs) != 2 or not _finite_constant(graph, power.inputs[1], nonzero=False):
        return None
    base, value = power.inputs[0], power.outputs[0]
    for _ in range(_LONGEST_CHAIN):
        tensor = graph.tensors.get(value)
        readers = graph.consumers(value)
        if tensor is None or tensor.is_graph_output or len(readers) != 1:
            return None
        reader = graph.nodes[readers[0][0]]
        if reader.domain:
            return None
        if reader.op in SATURATING:
            return reader.name
        if len(reader.inputs) != 2 or reader.op not in ("Mul", "Add"):
            return None
        other = reader.inputs[1 - readers[0][1]]
        if reader.op == "Mul" and not _finite_constant(graph, other, nonzero=True):
            return None
        if reader.op == "Add" and other != base and not _finite_constant(graph, other):
            return None
        value = reader.outputs[0]
    return None


def _finite_constant(graph: OpGraph, name: str, *, nonzero: bool = False) -> bool:
    """Whether ``name`` is a stored value (not an overridable input) whose values are all
    finite (and non-zero with ``nonzero``). Read only for the few nodes that get here."""
    tensor = graph.tensors.get(name)
    if tensor is None or not tensor.is_constant or tensor.is_graph_input:
        return False
    values = np.asarray(tensor.load_value())  # type: ignore[misc]
    if values.size > 64 or not np.issubdtype(values.dtype, np.floating):
        return False
    return bool(np.isfinite(values).all() and (not nonzero or np.all(values != 0)))
