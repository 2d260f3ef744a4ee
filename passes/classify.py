"""classify: each node's initial class and the reason for it.

Rules, in the order they are tried (the first that applies decides):

1. A node that is a Cast already in the model, or that computes on no float type, is left to
   the casts pass (``cast`` / ``no_float``).
2. A node that owns bodies the graph holds (If/Loop/Scan, a function call) computes nothing
   itself: its bodies' nodes are decided like any other (``control_flow``, precision none).
   One whose bodies the dialect could not enter stays float32 with its bodies untouched; a
   node with no schema (custom domain) is kept as it is (``control_flow`` / ``opaque``).
   A boundary node (one value across a body's boundary: an If output and its branches'
   results, a loop-carried value) follows its neighbours as a clear-list op does, after rules
   3 and 4; one the dialect cannot cast (a sequence) keeps its type (``control_flow``).
3. A node whose computation type is already the target (or any type but float32) keeps it
   (``already_low``, ``float64``); one whose computation-type input has an unknown type stays
   float32 rather than risk a missing cast (``type_unknown``).
4. ``deny_names`` (glob on node name or scope: a body's node by its path or its own name) and
   ``deny_tensors`` (any input or output name; a body's value by its path or its own name)
   make a node deny: float32, and deny spreads from it as from a deny-list op.
5. The op's list: allow / infer / clear / deny; an unlisted op stays float32 (``unlisted``),
   except under ``spread = "all"``, where it goes on to rule 6 like a listed op (the
   spread_all pass then lowers it).
6. A listed op whose schema does not admit the target type, or which reads a stored weight
   whose values would overflow the target type, stays float32 (``schema`` /
   ``weight_range``) without spreading deny: weights are never silently clamped. So does a
   quantiser (DequantizeLinear, QuantizeLinear) whose stored scale falls below the target's
   normal range (``weight_range``: a rounded scale would shift every quantisation step).

The result maps every node to a :class:`NodeDecision`; for allow/infer/clear the precision is
provisional until :class:`~graphamp.passes.paint.PaintPass` runs.
"""

from __future__ import annotations

import logging

import ml_dtypes
import numpy as np

from graphamp.core.dtypes import LOW_TYPES, UNKNOWN, numpy_type
from graphamp.core.graph import NodeKind, OpNode
from graphamp.core.vocab import ListName, Precision, Rule
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.passes.weights import WeightRanges
from graphamp.plans.records import NodeDecision
from graphamp.policy.policy import Policy

log = logging.getLogger(__name__)

# Node kinds a dialect reads from a model that classify leaves as they are.
_KEPT_KINDS = {
    NodeKind.CONTROL_FLOW: (
        Rule.CONTROL_FLOW,
        "{op} owns subgraphs: kept float32, bodies left as they are",
    ),
    NodeKind.OPAQUE: (Rule.OPAQUE, "no schema for {op}: kept as it is"),
}


_LIST_RULES = {name: Rule(name) for name in ListName}


class ClassifyPass(Pass):
    """Give every node its initial class (see the module docstring)."""

    name = "classify"
    gives = frozenset({Fact.CLASSIFIED})

    def run(self, context: PassContext) -> PassResult:
        classify = _Classifier(context.policy, context.weights)
        context.decisions = {node.name: classify(node) for node in context.graph}
        for node in context.graph:
            if node.kind is NodeKind.CONTROL_FLOW and not node.bodies:
                context.warnings.append(
                    f"node {node.name!r} ({node.op}): graphamp does not enter the bodies of"
                    f" {node.op}: kept float32 with its bodies as they are"
                )
        log.debug("classified %d nodes", len(context.decisions))
        return PassResult(modified=False)


class _Classifier:
    """:func:`classify_node` over a whole graph, each op type's rules applied once.

    Where the policy has no name or tensor rule, rules 1-6 but the weights' read nothing of a
    plain op but its op type's facts (list, schema, kernel, computation type, FLOPs): the
    nodes of one op type with the same facts share the decision (a large graph has far fewer
    such types than nodes). The weights rule is still applied node by node, to the nodes that
    read a stored value, but once a stored value is known to fit (measured, or of another type
    than float32) a node that reads only such values is not looked at again: the many
    readers of one shared weight ask once. Decisions are never changed in place (a pass replaces a
    node's), so sharing one is safe.
    """

    def __init__(self, policy: Policy, weights: WeightRanges) -> None:
        self.policy, self.weights = policy, weights
        self.by_name = bool(policy.deny_names or policy.allow_names or policy.deny_tensors)
        self.by_type: dict[tuple[object, ...], tuple[NodeDecision, bool]] = {}
        self.stored = {  # the values rule 6 may look at (graph inputs' values are not known)
            name
            for name, tensor in weights.graph.tensors.items()
            if tensor.is_constant and not tensor.is_graph_input
        }
        # Stored values that cannot keep a reader float32 but as a quantisation scale: not
        # float32, or measured and found to fit (the weights rule measured them already).
        self.fits: set[str] = set()

    def __call__(self, node: OpNode) -> NodeDecision:
        if self.by_name or node.kind is not NodeKind.OP:
            return classify_node(node, self.policy, self.weights)
        key = (
            node.op,
            node.compute_type,
            bool(node.follow_inputs or node.follow_outputs),
            node.allowed_types,
            node.schema_source,
            node.no_kernel,
            node.flops,
        )
        found = self.by_type.get(key)
        if found is None:
            found = self.by_type[key] = _rules(node, self.policy, self.weights)
        decision, weighed = found
        if not weighed or self.stored.isdisjoint(node.inputs):
            return decision
        reads = self.stored.intersection(node.inputs)
        if reads <= self.fits and node.op not in SCALED_OPS:
            return decision
        vetoed = _weight_range(node, self.weights, self.policy.dtype)
        if vetoed is not None:
            return vetoed
        tensors = self.weights.graph.tensors
        self.fits.update(name for name in reads if tensors[name].dtype != "float32")
        self.fits.update(stored_float32_inputs(node, self.weights))  # each one measured
        return decision


def classify_node(node: OpNode, policy: Policy, weights: WeightRanges) -> NodeDecision:
    """The initial class of one node under ``policy``."""
    decision, weighed = _rules(node, policy, weights)
    if weighed:
        return _weight_range(node, weights, policy.dtype) or decision
    return decision


def _rules(node: OpNode, policy: Policy, weights: WeightRanges) -> tuple[NodeDecision, bool]:
    """The class of ``node`` by every rule but the weights' (rule 6's weight_range), and
    whether that rule may still keep it float32: the class would otherwise come from the
    node's list or an allow_names rule."""
    low = policy.dtype
    op, flops = node.op, node.flops

    def decide(precision: str, rule: Rule, reason: str) -> tuple[NodeDecision, bool]:
        if not isinstance(precision, Precision):  # (an Enum call costs more than the check)
            precision = Precision(precision)
        return NodeDecision(op, precision, rule, reason, flops=flops), False

    if node.kind is NodeKind.CAST:
        return decide(Precision.NONE, Rule.CAST, f"Cast to {node.cast_to} already in the model")
    if node.kind is NodeKind.CONSTANT:
        return decide(
            Precision.NONE, Rule.NO_FLOAT, "stored value: converted by the casts pass if needed"
        )
    if node.kind is NodeKind.CONTROL_FLOW and node.bodies:
        return decide(
            Precision.NONE,
            Rule.CONTROL_FLOW,
            f"{node.op}: computes nothing itself; its bodies ({', '.join(node.bodies)}) are"
            " decided node by node and its outputs by its boundary nodes",
        )
    if node.kind is NodeKind.BOUNDARY and "kept" in node.params:
        return decide(
            Precision.NONE, Rule.CONTROL_FLOW, f"{node.params['boundary']}; {node.params['kept']}"
        )
    if node.kind is not NodeKind.OP and node.kind in _KEPT_KINDS:  # (an Enum hash is slow)
        rule, template = _KEPT_KINDS[node.kind]
        reason = template.format(op=node.op, domain=node.domain or "ai.onnx")
        return decide(Precision.FLOAT32, rule, reason)
    if not node.follow_inputs and not node.follow_outputs:
        return decide(Precision.NONE, Rule.NO_FLOAT, "computes on no float type")
    compute = node.compute_type or UNKNOWN
    if compute == UNKNOWN:
        return decide(
            Precision.FLOAT32,
            Rule.TYPE_UNKNOWN,
            "type of its inputs unknown after type inference: kept float32",
        )
    if compute in LOW_TYPES:
        return decide(
            compute, Rule.ALREADY_LOW, f"already computes in {compute} in the input model"
        )
    if compute != "float32":
        return decide(compute, Rule(compute), f"computes in {compute}: left as it is")

    pattern = policy.denied_name(node.name, node.scope) if policy.deny_names else None
    if pattern is not None:
        return decide(Precision.FLOAT32, Rule.DENY_NAME, f"deny_names rule {pattern!r}")
    for tensor in (*node.inputs, *node.outputs) if policy.deny_tensors else ():
        # a body's value by its path or by its own name in the body
        local = weights.graph.local_name(tensor) if node.body and tensor else tensor
        if tensor and (tensor in policy.deny_tensors or local in policy.deny_tensors):
            return decide(
                Precision.FLOAT32,
                Rule.DENY_TENSOR,
                f"deny_tensors rule: reads or writes {tensor!r}",
            )

    if node.kind is NodeKind.BOUNDARY and low not in node.allowed_types:
        return decide(
            Precision.FLOAT32,
            Rule.SCHEMA,
            f"{node.params.get('boundary', node.op)}: {node.op.split('.')[0]} at "
            f"{node.schema_source or 'this opset'} does not admit {low}: kept float32",
        )
    if node.kind is NodeKind.BOUNDARY:
        return decide(
            Precision.FLOAT32,
            Rule.CLEAR,
            f"{node.params.get('boundary', node.op)}: follows its neighbours as a clear-list op",
        )
    list_name, list_reason = policy.list_of(node.op)
    # allow_names: low whatever the lists say, where the schema, kernel and weights allow
    allowed = policy.allowed_name(node.name, node.scope) if policy.allow_names else None
    if list_name is None and allowed is None and policy.spread != "all":
        return decide(
            Precision.FLOAT32, Rule.UNLISTED, f"{node.op} is in no list: unlisted ops stay float32"
        )
    if list_name is ListName.DENY and allowed is None:
        return decide(Precision.FLOAT32, Rule.DENY, f"deny list: {list_reason}")
    if low not in node.allowed_types:
        return decide(
            Precision.FLOAT32,
            Rule.SCHEMA,
            f"{node.op} at {node.schema_source} does not admit {low}: kept float32",
        )
    if node.no_kernel:
        return decide(Precision.FLOAT32, Rule.NO_KERNEL, f"{node.no_kernel}: kept float32")
    if allowed is not None:
        decision, _ = decide(low, Rule.ALLOW_NAME, f"allow_names rule {allowed!r}")
    elif list_name is None:  # spread "all": the spread_all pass lowers it
        reason = f"{node.op} is in no list: --spread all runs it low where nothing keeps it"
        decision, _ = decide(Precision.FLOAT32, Rule.UNLISTED, reason)
    else:
        precision = low if list_name is ListName.ALLOW else Precision.FLOAT32
        reason = f"{list_name} list: {list_reason}"
        decision, _ = decide(precision, _LIST_RULES[list_name], reason)
    return decision, True


def _weight_range(node: OpNode, weights: WeightRanges, low: str) -> NodeDecision | None:
    """Rule 6's weights: float32 (``weight_range``) where ``node`` reads a quantisation scale
    below ``low``'s normal range or a weight whose values would overflow it, else None."""
    tiny = _subnormal_scale(node, weights, low)
    if tiny is not None:
        name, value = tiny
        return NodeDecision(
            node.op,
            Precision.FLOAT32,
            Rule.WEIGHT_RANGE,
            f"quantisation scale {name!r} holds {value:.3g}, below {low}'s normal range: kept"
            " float32, every quantisation step exact",
            flops=node.flops,
        )
    too_large = _overflowing_weight(node, weights)
    if too_large is not None:
        name, value = too_large
        return NodeDecision(
            node.op,
            Precision.FLOAT32,
            Rule.WEIGHT_RANGE,
            f"weight {name!r} holds |x| up to {value:.6g}, beyond {low}'s range:"
            " kept float32 instead of clamping",
            flops=node.flops,
        )
    return None


def stored_float32_inputs(node: OpNode, weights: WeightRanges) -> list[str]:
    """Names of the stored float32 values (not overridable graph inputs) that ``node`` reads
    through its computation-type slots, in slot order."""
    tensors = weights.graph.tensors
    names = []
    follow = node.follow_inputs
    for slot in sorted(follow) if len(follow) > 1 else follow:
        name = node.inputs[slot] if slot < len(node.inputs) else ""
        tensor = tensors.get(name)
        if tensor is None or not tensor.is_constant or tensor.dtype != "float32":
            continue
        if tensor.is_graph_input:  # an overridable initializer: its values are not known
            continue
        names.append(name)
    return names


def _overflowing_weight(node: OpNode, weights: WeightRanges) -> tuple[str, float] | None:
    """The first stored float32 computation-type input whose values overflow the target."""
    for name in stored_float32_inputs(node, weights):
        stats = weights.stats(name)
        if stats.overflows:
            return name, stats.absmax
    return None


# Ops whose input 1 is a quantisation scale: a scale rounded to a subnormal loses most of its
# bits, and every value the op writes or reads is off by that much.
SCALED_OPS = frozenset({"DequantizeLinear", "QuantizeLinear"})


def _subnormal_scale(node: OpNode, weights: WeightRanges, low: str) -> tuple[str, float] | None:
    """A quantisation op's stored scale with a non-zero magnitude below ``low``'s smallest
    normal (float16: 6.1e-5), or None."""
    if node.op not in SCALED_OPS or 1 not in node.follow_inputs or len(node.inputs) < 2:
        return None
    name = node.inputs[1]
    if name not in stored_float32_inputs(node, weights):
        return None
    values = np.abs(np.asarray(weights.graph.tensors[name].stored_value(), dtype=np.float64))
    values = values[values > 0]
    smallest = float(values.min()) if values.size else 0.0
    normal = float(ml_dtypes.finfo(numpy_type(low)).tiny)
    return (name, smallest) if 0 < smallest < normal else None
