"""isolated: allow-list norms with nothing low around them stay float32.

The allow list puts a normalization (LayerNormalization, RMSNormalization, onnxruntime's fused
Skip and Group norms) low wherever its schema and the target allow, as it puts a matrix product
low: a norm reads and writes its activations, and in the low type it moves half the bytes. That
holds where the ops around it run low too. Where they compute float32 (a ``quantize_dynamic``
model, whose products are integer; a model whose convolutions have no low kernel on the
target), the norm's low region (the ops decided low joined to it through the values they read
and write: a Transpose on each side, say) is an island: Casts on its border, more bytes than
the region saves, and a rounding the float32 model never had, which a quantiser after it
amplifies (converted so, three of four ``quantize_dynamic`` models failed their own
``--verify``). After the decide step, such a region goes back to float32: its norms with rule
``isolated``, its infer and clear ops with their own rule, each reason saying why.

A region is an island when none of its ops is a low op of another kind (a matrix product, an
attention: they run faster low whatever their Casts cost), an ``allow_names`` match or a norm
the policy moved into allow (the user's word), an op the model already computes low, and
none reads a graph input or writes a graph output that ``keep_io_types`` leaves free (a value
that may be retyped rather than cast).
"""

from __future__ import annotations

from graphamp.core.dtypes import LOW_TYPES
from graphamp.core.graph import NodeKind, OpGraph, OpNode
from graphamp.core.vocab import Precision, Rule
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.passes.kept import Regions, slot_values
from graphamp.plans.records import NodeDecision
from graphamp.policy.policy import Policy


class IsolatedPass(Pass):
    """Keep float32 the allow-list norms of low regions that hold nothing else that gains
    from the low type (module docstring)."""

    name = "isolated"
    requires = frozenset({Fact.DECIDED})

    def run(self, context: PassContext) -> PassResult:
        graph, decisions = context.graph, context.decisions
        low = [node for node in graph if decisions[node.name].precision in LOW_TYPES]
        regions = Regions(graph, low)
        members: dict[str, list[str]] = {}
        for node in low:
            members.setdefault(regions.find(node.name), []).append(node.name)
        kept = 0
        for region in members.values():
            norms = [n for n in region if _isolable_norm(graph.nodes[n], decisions[n])]
            if not norms or not _island(graph, region, decisions, context.policy):
                continue
            for name in sorted(region):
                before = decisions[name]
                norm = name in norms
                reason = (
                    f"allow list, but nothing around it runs low: in {before.precision} it "
                    "would need Casts on its low region's border, more bytes than it saves, and "
                    "round what no neighbour rounds"
                    if norm
                    else f"{before.rule} list op between isolated norms ({norms[0]!r}): float32 "
                    "with them"
                )
                decisions[name] = NodeDecision(
                    op=before.op,
                    precision=Precision.FLOAT32,
                    rule=Rule.ISOLATED if norm else before.rule,
                    reason=reason,
                    flops=before.flops,
                )
                kept += norm
        return PassResult(modified=False, note=f"{kept} isolated norms kept float32")


def is_norm(op: str) -> bool:
    """A normalization op of any domain (``com.microsoft.SkipLayerNormalization``,
    ``RMSNormalization``, ``com.microsoft.GroupNorm``)."""
    name = op.rsplit(".", 1)[-1]
    return name.endswith(("Normalization", "Norm"))


def _isolable_norm(node: OpNode, decision: NodeDecision) -> bool:
    return (
        node.kind is NodeKind.OP
        and decision.rule is Rule.ALLOW
        and decision.precision in LOW_TYPES
        and is_norm(node.op)
    )


def _island(
    graph: OpGraph, region: list[str], decisions: dict[str, NodeDecision], policy: Policy
) -> bool:
    """Whether nothing in ``region`` gains from the low type (module docstring)."""
    for name in region:
        node, decision = graph.nodes[name], decisions[name]
        if not (_isolable_norm(node, decision) or decision.rule in (Rule.INFER, Rule.CLEAR)):
            return False
        if node.op in policy.moved_ops:  # a norm the user moved into allow: the user's word
            return False
        touched = slot_values(node.inputs, node.follow_inputs)
        touched += slot_values(node.outputs, node.follow_outputs)
        for value in touched:
            tensor = graph.tensors.get(value)
            if tensor is None or policy.keeps_io(value):
                continue  # (a kept input or output is cast, as any float32 neighbour)
            if (tensor.is_graph_input and not tensor.is_constant) or tensor.is_graph_output:
                return False  # may be retyped rather than cast
    return True
