"""qdq: a quantised op of a QDQ model stays float32 where one of its quantisers must.

A QDQ model (what onnxruntime's quantizer, ModelOpt and TensorRT's tools write) marks each
quantised op with a ``DequantizeLinear`` on every float input and a ``QuantizeLinear`` on
every float output: ``DQ -> MatMul -> Q``. A runtime fuses such a group into one integer
kernel. Before opset 19 the schemas fix a DequantizeLinear's output and a QuantizeLinear's
input to float32, so the op in the low type would pay a Cast after each DequantizeLinear and
one before each QuantizeLinear, a Cast pair for nothing but breaking the group the runtime
fuses. Rules:

1. An allow-class op whose every computation-type input comes from a DequantizeLinear
   (directly or through Identity ops: the quantizer's copies of a shared weight) and whose
   every computation-type output is read only by QuantizeLinear ops (or is a graph output
   that ``keep_io_types`` keeps float32: a classifier's last Gemm) stays float32 with rule
   ``qdq`` when any of those quantisers cannot take the low type (its schema's, its kernel's
   or its scale's reason): in the low type it would pay a Cast between that quantiser and the
   op, inside the group the runtime fuses into one integer kernel, for nothing the integer
   kernel computes. Before opset 19 every quantiser is such a one; from 19 a weight's scale
   below float16's normal range (rule ``weight_range``) keeps its DequantizeLinear float32
   and with it its op.
2. From opset 19 the quantisers take the low type themselves (a DequantizeLinear writes its
   scale's type; the casts pass stores the scale low), so where all of a group's can, rule 1
   finds nothing: the group runs low with no Cast.

The integer tensors are never touched: they are no computation-type slot of any op.
"""

from __future__ import annotations

from graphamp.core.graph import OpGraph
from graphamp.core.vocab import Precision, Rule
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.plans.records import NodeDecision
from graphamp.policy.policy import Policy


class QdqPass(Pass):
    """Keep float32 the quantised ops whose quantisers stay float32 (module docstring)."""

    name = "qdq"
    requires = frozenset({Fact.CLASSIFIED})
    dialect = "onnx"  # ONNX's QuantizeLinear and DequantizeLinear

    def applies(self, context: PassContext) -> bool:
        return any(node.op == "DequantizeLinear" for node in context.graph)

    def run(self, context: PassContext) -> PassResult:
        graph, decisions, low = context.graph, context.decisions, context.policy.dtype
        kept = 0
        for node in graph:
            decision = decisions[node.name]
            if decision.rule is not Rule.ALLOW or decision.precision != low:
                continue
            quantiser = _pinning_quantiser(graph, node.name, decisions, context.policy)
            if quantiser is None:
                continue
            pin = decisions[quantiser]
            decisions[node.name] = NodeDecision(
                op=decision.op,
                precision=Precision.FLOAT32,
                rule=Rule.QDQ,
                reason="a quantised op (DequantizeLinear on its inputs, QuantizeLinear on its "
                f"outputs): its quantiser {quantiser!r} cannot take {low} (rule {pin.rule}), "
                "so the op stays float32, with no Cast pair around it, as the runtime fuses "
                "the group",
            )
            kept += 1
        return PassResult(modified=False, note=f"{kept} quantised ops kept float32")


def _pinning_quantiser(
    graph: OpGraph, name: str, decisions: dict[str, NodeDecision], policy: Policy
) -> str | None:
    """Rule 1's condition for node ``name``: the first quantiser of its group that cannot take
    the low type, or None where the rule does not hold."""
    node = graph.nodes[name]
    inputs = [node.inputs[s] for s in sorted(node.follow_inputs) if s < len(node.inputs)]
    outputs = [node.outputs[s] for s in sorted(node.follow_outputs) if node.outputs[s]]
    if not inputs or not outputs:
        return None
    quantisers: list[str] = []
    for value in inputs:
        producer = graph.tensors[value].producer if value else None
        while producer is not None and graph.nodes[producer].op == "Identity":
            source = graph.nodes[producer].inputs[0]  # the quantizer's copy of a shared weight
            producer = graph.tensors[source].producer
        if producer is None or graph.nodes[producer].op != "DequantizeLinear":
            return None
        quantisers.append(producer)
    for value in outputs:
        readers = graph.consumers(value)
        if graph.tensors[value].is_graph_output and not policy.keeps_io(value):
            return None  # the user asked for this output in the low type
        if not readers and not graph.tensors[value].is_graph_output:
            return None
        for reader, slot in readers:
            if graph.nodes[reader].op != "QuantizeLinear" or slot != 0:
                return None
            quantisers.append(reader)
    # a quantiser decided clear or infer can take the low type (opset 19+, a normal scale)
    return next((q for q in quantisers if decisions[q].rule not in (Rule.CLEAR, Rule.INFER)), None)
