"""casts: turn precision decisions into the fewest casts and weight conversions.

Every input slot *requires* a dtype: the target type for a computation-type slot of a node that
runs in low precision, the tensor's original type everywhere else (so a float32 node, a Cast or
an opaque node sees exactly what the input model gave it). Every tensor *has* a dtype: the
target type for a computation-type output of a low-precision node, else its original type.
Where the two differ, in this order:

1. A stored value (initializer, Constant) is converted, never cast at run time: in place when
   every reader wants the new type, else stored once more as ``<name>__<dtype>``. Values that
   flush to zero are counted; values that would overflow never get here (classify keeps their
   reader float32).
2. A slot reading the output of a lossless widening Cast already in the model (float16 ->
   float32) that needs the Cast's source type reads the source instead: no Cast of a Cast that
   undoes it.
3. Otherwise one Cast per (tensor, dtype), shared by every slot that needs it.

Casts already in the model: a Cast to float32 whose readers all want the target type is
retargeted to it; a Cast whose input already has its target type is removed (its readers read
the input), and so is one left with no reader. Graph inputs not kept by ``keep_io_types`` take
the target type when all their readers want it; kept graph outputs are cast back under their
original name.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from graphamp.core.dtypes import LOW_TYPES, cast_bytes
from graphamp.core.graph import NodeKind, OpGraph, OpNode
from graphamp.core.names import Names
from graphamp.core.vocab import Rule
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.passes.model_casts import share_model_casts
from graphamp.passes.output_casts import (
    cache_pairs,
    outputs_cast_back,
    plan_output_casts,
    read_low_values,
)
from graphamp.passes.stored_casts import kept_weights, plan_weights
from graphamp.passes.weights import WeightRanges
from graphamp.plans.edits import EditScript
from graphamp.plans.records import CastRecord, NodeDecision, WeightRecord
from graphamp.policy.policy import Policy

log = logging.getLogger(__name__)

LOSSLESS_WIDENING = frozenset(
    {
        ("float16", "float32"),
        ("bfloat16", "float32"),
        ("float16", "float64"),
        ("bfloat16", "float64"),
        ("float32", "float64"),
    }
)


class CastsPass(Pass):
    """Turn the decisions into casts, weight conversions and cast clean-up (see the module
    docstring)."""

    name = "casts"
    requires = frozenset({Fact.DECIDED})
    gives = frozenset({Fact.EDITS})

    def run(self, context: PassContext) -> PassResult:
        context.script, context.kept_weights = plan_casts(
            context.graph, context.decisions, context.policy, context.weights
        )
        script = context.script
        script.rewrites = list(context.rewrites)
        return PassResult(
            modified=bool(script.casts or script.output_casts or script.weights),
            note=f"{len(script.casts) + len(script.output_casts)} casts",
        )


def plan_casts(
    graph: OpGraph, decisions: dict[str, NodeDecision], policy: Policy, weights: WeightRanges
) -> tuple[EditScript, list[WeightRecord]]:
    """The edits that realise ``decisions`` on ``graph`` (see the module docstring), and the
    weights kept in their type because their values would overflow the target."""
    low = policy.dtype
    edits = EditScript()
    original = {name: tensor.dtype for name, tensor in graph.tensors.items()}

    # the nodes that run low (looked up once: every slot of the graph asks)
    lows = {
        name
        for name, decision in decisions.items()
        if decision.precision == low and decision.rule is not Rule.ALREADY_LOW
    }

    def required(node: OpNode, slot: int, tensor: str) -> str:
        if slot >= 0 and slot in node.follow_inputs:
            if node.name in lows:
                return _low_reads(node, slot, original[tensor], low)
            if node.compute_type == "float32" and original[tensor] in LOW_TYPES:
                # a float32 op reading a low value beside float32 ones (fx, where PyTorch
                # promotes; a low activation into a float32 weight after a graph break)
                return "float32"
        return original[tensor]

    # What every tensor holds after the conversion, and the model's own Casts: the one walk
    # of the graph before the slots', so that each step about those Casts walks only them.
    has = dict(original)
    low_nodes, retype = edits.low_nodes, edits.retype
    model_casts: list[OpNode] = []
    for node in graph:
        if node.name in lows:
            low_nodes[node.name] = low
            outputs = node.outputs
            for slot in node.follow_outputs:
                if outputs[slot]:
                    has[outputs[slot]] = retype[outputs[slot]] = low
        if node.kind is NodeKind.CAST:
            model_casts.append(node)

    readers = _Readers(graph)

    def all_readers_want(tensor: str, dtype: str) -> bool:
        slots = [(n, s) for n, s in readers.get(tensor) if not reads_any_type(n, s)]
        return bool(slots) and all(required(n, s, tensor) == dtype for n, s in slots)

    caches = cache_pairs(graph)
    for name in graph.graph_inputs:
        tensor = graph.tensors[name]
        if (
            not tensor.type_fixed
            and tensor.dtype == "float32"
            and not policy.keeps_io(name)
            and not tensor.is_constant
            and not tensor.is_graph_output
            and all_readers_want(name, low)
            # a KV cache's past input takes the type its present output will have
            and (name not in caches or has.get(caches[name], low) == low)
        ):
            has[name] = low
            edits.retype[name] = low

    cast_back = outputs_cast_back(graph, policy, has, caches)
    # Casts already in the model: retarget, then find the ones that became no-ops (reading an
    # output cast back, a Cast to that output's original type is one too).
    alias: dict[str, str] = {}
    for node in model_casts:
        if not node.inputs or not node.inputs[0]:
            continue
        out = node.outputs[0]
        if (
            has[out] == "float32"
            and not graph.tensors[out].is_graph_output
            and all_readers_want(out, low)
        ):
            edits.retarget_casts[node.name] = low
            has[out] = low
            edits.retype[out] = low
        source = _resolve(alias, node.inputs[0])
        if (
            has[out] in (has[source], cast_back.get(source))
            and not graph.tensors[out].is_graph_output
        ):
            alias[out] = source
            edits.remove_nodes.append(node.name)
            edits.retarget_casts.pop(node.name, None)

    # Every slot: read through removed casts, then convert, reroute or cast.
    cast_readers: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    weight_readers: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    removed = set(edits.remove_nodes)
    # The values read as they are, kept only where something asks: whether a model's Cast is
    # still read (none to ask about: no model Cast), which slots read a value a graph output's
    # Cast back renames (none without a Cast back). Most slots of a graph land here.
    still_read: set[str] = set()
    reads_casts = bool(model_casts)
    as_is: list[tuple[str, int]] = []  # slots rewired to a value they read in the type it has
    renames = bool(cast_back)
    tensors = graph.tensors
    for node in graph:
        if node.name in removed:
            continue
        # (the slots' wants and reads_any_type inline: this loop meets every read of the graph)
        node_low = node.name in lows
        node_float32 = not node_low and node.compute_type == "float32"
        follow, any_type = node.follow_inputs, node.any_type_inputs
        is_cast = node.kind is NodeKind.CAST
        for slot, name in _slots(node) if node.implicit_inputs else enumerate(node.inputs):
            if not name:
                continue
            source = _resolve(alias, name) if name in alias else name
            if source != name:
                edits.rewire[(node.name, slot)] = source
            held = has[source]
            if slot in any_type or (is_cast and slot == 0):  # reads_any_type
                want = held
            elif slot >= 0 and node_low and slot in follow:  # required
                want = _low_reads(node, slot, held, low) if node.float32_params else low
            elif slot >= 0 and slot in follow and node_float32 and original[name] in LOW_TYPES:
                want = "float32"  # required: a float32 op reading a low value (fx)
            else:
                want = original[name]
            if held == want:
                if reads_casts:
                    still_read.add(source)
                if renames:
                    as_is.append((node.name, slot))
                continue
            tensor = tensors[source]
            if tensor.is_constant and not tensor.is_graph_input:
                weight_readers[(source, want)].append((node.name, slot))
            elif (widened := _lossless_cast_source(graph, source, has, alias)) is not None and has[
                widened
            ] == want:
                edits.rewire[(node.name, slot)] = widened
                still_read.add(widened)
                as_is.append((node.name, slot))
            else:
                # cast from before a lossless widening: no Cast of a Cast that could be one
                if widened is not None and not graph.tensors[widened].is_constant:
                    source = widened
                cast_readers[(source, want)].append((node.name, slot))
                still_read.add(source)

    share_model_casts(
        graph, cast_readers, model_casts, alias, removed, has, edits, still_read, cast_back
    )

    # Casts already in the model that the rerouting above left with no reader (one that had
    # none in the model is left as it is: removing it would leave its own input Cast readerless
    # for the next conversion, which would then remove that one too).
    for node in model_casts:
        if (
            node.name not in removed
            and node.outputs[0] not in still_read
            and readers.get(node.outputs[0])
            and not graph.tensors[node.outputs[0]].is_graph_output
        ):
            edits.remove_nodes.append(node.name)
            edits.retarget_casts.pop(node.name, None)
            removed.add(node.name)

    names = Names(graph)  # every name added is new in the whole model
    shared: dict[str, list[str]] = defaultdict(list)  # output -> readers of its cast back
    for (source, want), slots in cast_readers.items():
        if cast_back.get(source) == want:
            # A kept output is cast back under its own name anyway: its float32 readers read
            # that Cast instead of a second, identical one.
            shared[source].extend(n for n, _ in slots)
            for slot_key in slots:
                edits.rewire[slot_key] = source
            continue
        output = names.derived(source, f"__{want}")
        edits.casts.append(
            CastRecord(
                tensor=source,
                src=has[source],
                dst=want,
                output=output,
                consumers=sorted({n for n, _ in slots}),
                bytes=cast_bytes(graph.tensors[source].shape, has[source], want),
            )
        )
        for slot_key in slots:
            edits.rewire[slot_key] = output

    plan_weights(graph, weight_readers, has, edits, names, weights)
    kept = kept_weights(graph, decisions, weights)
    plan_output_casts(graph, has, edits, names, cast_back, shared)
    read_low_values(edits, as_is)
    log.info(
        "%d casts inserted, %d retargeted, %d removed, %d weights converted",
        len(edits.casts) + len(edits.output_casts),
        len(edits.retarget_casts),
        len(edits.remove_nodes),
        len(edits.weights),
    )
    return edits, kept


def _low_reads(node: OpNode, slot: int, dtype: str, low: str) -> str:
    """The type a computation-type slot of a node running low reads a value of ``dtype`` in:
    the low type, but a float32 parameter of a mixed-type norm as it is."""
    return dtype if slot in node.float32_params and dtype == "float32" else low


def reads_any_type(node: OpNode, slot: int) -> bool:
    """Whether slot ``slot`` of ``node`` reads a tensor in whatever float type it has: a slot
    of a type variable of its own, or the input of a Cast already in the model (a Cast of a
    float16 value to float32 is the Cast of its exact float32 widening; casting it to float32
    first would only add a Cast)."""
    return slot in node.any_type_inputs or (node.kind is NodeKind.CAST and slot == 0)


def _slots(node: OpNode) -> list[tuple[int, str]]:
    """(slot, tensor) for every read of ``node``; the k-th implicit (subgraph) read is slot
    ``-1 - k``, which a dialect rewires inside the node's subgraphs."""
    slots = [(slot, name) for slot, name in enumerate(node.inputs) if name]
    slots.extend((-1 - k, name) for k, name in enumerate(node.implicit_inputs))
    return slots


def _resolve(alias: dict[str, str], name: str) -> str:
    while name in alias:
        name = alias[name]
    return name


def _lossless_cast_source(
    graph: OpGraph, tensor: str, has: dict[str, str], alias: dict[str, str]
) -> str | None:
    """The input of the Cast producing ``tensor`` if that Cast only widened its input (read
    through Casts removed as no-ops: their outputs are gone)."""
    producer = graph.tensors[tensor].producer
    if producer is None:
        return None
    node = graph.nodes[producer]
    if node.kind is not NodeKind.CAST or not node.inputs or not node.inputs[0]:
        return None
    source = _resolve(alias, node.inputs[0])
    return source if (has[source], has[tensor]) in LOSSLESS_WIDENING else None


class _Readers:
    """The (node, slot) readers of a tensor, listed when first asked for: only graph inputs,
    Casts and weights are, so a large graph lists a handful, not every tensor's."""

    def __init__(self, graph: OpGraph) -> None:
        self.graph = graph
        self.listed: dict[str, list[tuple[OpNode, int]]] = {}

    def get(self, name: str) -> list[tuple[OpNode, int]]:
        found = self.listed.get(name)
        if found is None:
            graph = self.graph
            found = (
                [(graph.nodes[n], s) for n, s in graph.consumers(name)]
                if name in graph.tensors
                else []
            )
            self.listed[name] = found
        return found
