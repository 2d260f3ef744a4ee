"""classify: each node's initial class and the reason for it.

Rules, in the order they are tried (the first that applies decides):

1. A node that is a Cast already in the model, or that computes on no float type, is left to
   the casts pass (``cast`` / ``no_float``).
2. A node that owns subgraphs (If/Loop/Scan) stays float32 with its bodies untouched; a node
   with no schema (custom domain) is kept as it is (``control_flow`` / ``opaque``).
3. A node whose computation type is already the target (or any type but float32) keeps it
   (``already_low``, ``float64``); one whose computation-type input has an unknown type stays
   float32 rather than risk a missing cast (``type_unknown``).
4. ``deny_names`` (glob on node name or scope) and ``deny_tensors`` (any input or output name)
   make a node deny: float32, and deny spreads from it as from a deny-list op.
5. The op's list: allow / infer / clear / deny; an unlisted op stays float32 (``unlisted``).
6. A listed op whose schema does not admit the target type, or which reads a stored weight
   whose values would overflow the target type, stays float32 (``schema`` /
   ``weight_range``) without spreading deny: weights are never silently clamped.

The result maps every node to a :class:`NodeDecision`; for allow/infer/clear the precision is
provisional until :func:`graphamp.passes.paint.paint` runs.
"""

from __future__ import annotations

import logging

import numpy as np

from graphamp.graph import LOW_TYPES, UNKNOWN, NodeKind, OpGraph, OpNode
from graphamp.passes.numerics import overflow_threshold
from graphamp.plan import NodeDecision
from graphamp.policy import Policy

log = logging.getLogger(__name__)


def classify(graph: OpGraph, policy: Policy) -> dict[str, NodeDecision]:
    """Initial class of every node of ``graph`` under ``policy``."""
    absmax_cache: dict[str, float] = {}
    decisions: dict[str, NodeDecision] = {}
    for node in graph:
        decisions[node.name] = _classify_node(graph, node, policy, absmax_cache)
    log.debug("classified %d nodes", len(decisions))
    return decisions


def _classify_node(
    graph: OpGraph, node: OpNode, policy: Policy, absmax_cache: dict[str, float]
) -> NodeDecision:
    low = policy.dtype

    def decide(precision: str, rule: str, reason: str) -> NodeDecision:
        return NodeDecision(op=node.op, precision=precision, rule=rule, reason=reason)

    if node.kind is NodeKind.CAST:
        return decide("none", "cast", f"Cast to {node.attrs.get('to')} already in the model")
    if node.kind is NodeKind.CONSTANT:
        return decide("none", "no_float", "stored value: converted by the casts pass if needed")
    if node.kind is NodeKind.CONTROL_FLOW:
        return decide(
            "float32",
            "control_flow",
            f"{node.op} owns subgraphs: kept float32, bodies left as they are",
        )
    if node.kind is NodeKind.OPAQUE:
        return decide(
            "float32",
            "opaque",
            f"no schema for {node.domain or 'ai.onnx'}::{node.op}: kept as it is",
        )
    if not node.follow_inputs and not node.follow_outputs:
        return decide("none", "no_float", "computes on no float type")
    compute = node.compute_type or UNKNOWN
    if compute == UNKNOWN:
        return decide(
            "float32",
            "type_unknown",
            "type of its inputs unknown after type inference: kept float32",
        )
    if compute in LOW_TYPES:
        return decide(compute, "already_low", f"already computes in {compute} in the input model")
    if compute != "float32":
        return decide(compute, compute, f"computes in {compute}: left as it is")

    pattern = policy.denied_name(node.name, node.scope)
    if pattern is not None:
        return decide("float32", "deny_name", f"deny_names rule {pattern!r}")
    for tensor in (*node.inputs, *node.outputs):
        if tensor and tensor in policy.deny_tensors:
            return decide(
                "float32", "deny_tensor", f"deny_tensors rule: reads or writes {tensor!r}"
            )

    list_name, list_reason = policy.list_of(node.op)
    if list_name is None:
        return decide("float32", "unlisted", f"{node.op} is in no list: unlisted ops stay float32")
    if list_name == "deny":
        return decide("float32", "deny", f"deny list: {list_reason}")
    if low not in node.allowed_types:
        return decide(
            "float32",
            "schema",
            f"{node.op} at opset {graph.opset} does not admit {low}: kept float32",
        )
    too_large = _overflowing_weight(graph, node, low, absmax_cache)
    if too_large is not None:
        name, value = too_large
        return decide(
            "float32",
            "weight_range",
            f"weight {name!r} holds |x| up to {value:.6g}, beyond {low}'s range:"
            " kept float32 instead of clamping",
        )
    precision = low if list_name == "allow" else "float32"
    return decide(precision, list_name, f"{list_name} list: {list_reason}")


def _overflowing_weight(
    graph: OpGraph, node: OpNode, low: str, absmax_cache: dict[str, float]
) -> tuple[str, float] | None:
    """The first stored float32 computation-type input whose values overflow ``low``."""
    limit = overflow_threshold(low)
    for slot in sorted(node.follow_inputs):
        name = node.inputs[slot] if slot < len(node.inputs) else ""
        tensor = graph.tensors.get(name)
        if tensor is None or not tensor.is_constant or tensor.dtype != "float32":
            continue
        if tensor.is_graph_input:  # an overridable initializer: its values are not known
            continue
        if name not in absmax_cache:
            absmax_cache[name] = _finite_absmax(tensor.load_value())  # type: ignore[misc]
        if absmax_cache[name] >= limit:
            return name, absmax_cache[name]
    return None


def _finite_absmax(values: np.ndarray) -> float:
    if values.size == 0:
        return 0.0
    largest = max(float(values.max()), -float(values.min()))  # no |values| temporary
    if np.isfinite(largest):
        return largest
    magnitudes = np.abs(values)
    finite = magnitudes[np.isfinite(magnitudes)]
    return float(finite.max()) if finite.size else 0.0
