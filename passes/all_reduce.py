"""Data-parallel training steps: gradients averaged over a process group, the overflow decision
agreed, gradients clipped by their global norm, as passes of the ``step`` pipeline.

* **all_reduce** (with a process group, before loss scaling): the gradients, in buckets of
  about ``bucket_bytes`` as DistributedDataParallel sends them, averaged over the ranks in
  ``grad_dtype`` (float16 halves the bytes). Under loss scaling the *scaled* gradients are
  reduced, so small values survive float16, and the unscale node reads the reduced ones. With
  accumulation the marked gradients are the effective batch's, so this reduces once per
  effective batch.
* The ranks agree on skipping a step: an inf or NaN in any rank's gradients is in the sum,
  so every rank's average holds it, every rank holds the same average bit for bit, and the
  finite check after the reduction decides alike everywhere (what GradScaler relies on under
  DDP). **all_reduce_found_inf** (with ``agree_found_inf``, after the finite check) also
  reduces ``found_inf`` with MAX: a collective each step, for whoever wants the flag itself
  agreed.
* **clip_grad_norm** (with ``clip_grad_norm``): the unscaled gradients scaled by
  min(1, max_norm / (total norm + 1e-6)) as ``torch.nn.utils.clip_grad_norm_``. After the
  reduction every rank holds the same averaged gradients, so their norm is the global one. It
  runs before the finite check: a non-finite gradient makes the total norm inf or NaN, the
  clipped gradient NaN, and the step is skipped as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from graphamp.core.graph import NodeKind, Role, TensorInfo
from graphamp.core.vocab import Precision, Rule
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.passes.loss_scale import add_node, reroute
from graphamp.training.distributed import buckets

FOUND_INF = "found_inf"


def elements(tensor: TensorInfo) -> int:
    dims = tensor.shape or ()
    return math.prod(d if isinstance(d, int) else 1 for d in dims)


def replace_gradients(
    context: PassContext, node: str, gradients: list[str], outputs: list[str]
) -> None:
    """The optimizer reads ``outputs`` where it read ``gradients``; they carry the role now."""
    tensors = context.graph.tensors
    for gradient, output in zip(gradients, outputs, strict=True):
        reroute(context, gradient, output, skip=node)
        tensors[gradient].role, tensors[output].role = None, Role.GRADIENT


def by_readiness(context: PassContext, role: Role) -> list[TensorInfo]:
    """The values of ``role`` in the order backward computes them (the node that makes each,
    looking through casts), so the first buckets can travel while backward goes on."""
    graph = context.graph
    position = {name: index for index, name in enumerate(graph.nodes)}

    def made_at(tensor: TensorInfo) -> int:
        producer = tensor.producer
        while producer is not None and graph.nodes[producer].kind is NodeKind.CAST:
            source = graph.nodes[producer].inputs[0]
            producer = graph.tensors[source].producer
        return position.get(producer, -1) if producer is not None else -1

    return sorted(graph.with_role(role), key=made_at)


class Bucketed(Protocol):
    """The settings of a collective that sends the gradients in buckets."""

    @property
    def world_size(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def bucket_bytes(self) -> int: ...
    @property
    def first_bucket_bytes(self) -> int | None: ...
    @property
    def item_bytes(self) -> int: ...
    def describe(self) -> str: ...


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def scaled_note(context: PassContext, dtype: str) -> str:
    """What a reason says of the gradients sent under loss scaling (nothing without it)."""
    if context.options.loss_scaling is None:
        return ""
    survive = f": small values survive {dtype}" if dtype != "float32" else ""
    return f"; the loss-scaled gradients travel and are unscaled after{survive}"


def average_in_buckets(
    context: PassContext,
    settings: Bucketed,
    kind: NodeKind,
    rule: Rule,
    suffix: str,
    params: dict[str, float | str],
    how: Callable[[int], str],
) -> PassResult:
    """Average the gradients over the ranks with one ``kind`` node per bucket of about
    ``settings.bucket_bytes``, in the order backward makes them (the first buckets travel
    while backward goes on); the optimizer reads the nodes' outputs. Node ``i`` is named
    ``<kind>.<i>``, its output of gradient ``g`` ``g.<suffix>``; its reason ends with
    ``how(bytes sent)``."""
    gradients = {g.name: g for g in by_readiness(context, Role.GRADIENT)}
    sizes = [(name, elements(g) * settings.item_bytes) for name, g in gradients.items()]
    groups = buckets(sizes, settings.bucket_bytes, settings.first_bucket_bytes)
    by_name = dict(sizes)
    for index, names in enumerate(groups):
        sent = sum(by_name[name] for name in names)
        node = add_node(
            context,
            kind,
            names,
            [(f"{name}.{suffix}", gradients[name].dtype) for name in names],
            rule,
            f"bucket {index + 1} of {len(groups)}: {plural(len(names), 'gradient')} averaged "
            f"over the {settings.world_size} ranks{how(sent)}",
            params=dict(params),
            name=f"{kind.value}.{index}",
            precision=Precision(settings.dtype),
        )
        replace_gradients(context, node.name, names, node.outputs)
    total = sum(by_name.values())
    return PassResult(
        modified=True, note=f"{len(groups)} buckets, {total} bytes: {settings.describe()}"
    )


class AllReducePass(Pass):
    """Average the gradients over the process group (see the module docstring)."""

    name = "all_reduce"

    def applies(self, context: PassContext) -> bool:
        return context.options.all_reduce is not None and bool(
            context.graph.with_role(Role.GRADIENT)
        )

    def run(self, context: PassContext) -> PassResult:
        reduce = context.options.all_reduce
        assert reduce is not None  # applies() checked it
        low = reduce.dtype != "float32"
        halved = " (half of float32's)" if low else ""
        why_scaled = scaled_note(context, reduce.dtype)
        if not reduce.agree_found_inf:  # (else all_reduce.found_inf says how they agree)
            why_scaled += (
                "; an inf or NaN on any rank is in every rank's average, so the finite check "
                "skips the step on every rank"
            )
        params: dict[str, float | str] = {
            "op": "mean",
            "group": reduce.group,
            "world_size": reduce.world_size,
            "dtype": reduce.dtype,
        }
        return average_in_buckets(
            context,
            reduce,
            NodeKind.ALL_REDUCE,
            Rule.ALL_REDUCE,
            "reduced",
            params,
            lambda sent: f", {sent} bytes sent as {reduce.dtype}{halved}{why_scaled}",
        )


class AgreeFoundInfPass(Pass):
    """Reduce the finite check's flag with MAX over the ranks (see the module docstring)."""

    name = "all_reduce_found_inf"
    requires = frozenset({Fact.FINITE_CHECKED})

    def applies(self, context: PassContext) -> bool:
        if FOUND_INF not in context.graph.tensors:
            return False
        reduce = context.options.all_reduce
        # A sharded step's ranks each check only their own shards: they must agree.
        return context.options.shard is not None or (reduce is not None and reduce.agree_found_inf)

    def run(self, context: PassContext) -> PassResult:
        sharding = context.options.shard
        sharded = sharding is not None
        reduce = sharding if sharding is not None else context.options.all_reduce
        assert reduce is not None  # applies() checked it
        why = "each rank checks only its own shards of the gradients, so " if sharded else ""
        node = add_node(
            context,
            NodeKind.ALL_REDUCE,
            [FOUND_INF],
            [(f"{FOUND_INF}.agreed", "bool")],
            Rule.ALL_REDUCE,
            f"found_inf is the largest over the ranks: {why}one rank's inf or NaN skips the "
            "step on every rank, and every rank's loss scale and skip count move the same way",
            params={"op": "max", "group": reduce.group, "world_size": reduce.world_size},
            name=f"all_reduce.{FOUND_INF}",
        )
        reroute(context, FOUND_INF, node.outputs[0], skip=node.name)
        # Built before the nodes that now read it (the step guard, the counters).
        added = context.script.new_nodes
        added.remove(node.name)
        added.insert(added.index("finite_check") + 1, node.name)
        return PassResult(modified=True)


class ClipGradNormPass(Pass):
    """Clip the unscaled gradients by their global norm (see the module docstring)."""

    name = "clip_grad_norm"

    def applies(self, context: PassContext) -> bool:
        return context.options.clip_grad_norm is not None and bool(
            context.graph.with_role(Role.GRADIENT)
        )

    def run(self, context: PassContext) -> PassResult:
        clipping = context.options.clip_grad_norm
        assert clipping is not None  # applies() checked it
        gradients = [g.name for g in context.graph.with_role(Role.GRADIENT)]
        reduced = context.options.all_reduce is not None
        where = " (every rank holds the averaged gradients)" if reduced else ""
        params: dict[str, float | str] = {
            "max_norm": clipping.max_norm,
            "norm_type": clipping.norm_type,
        }
        sharding = context.options.shard
        if sharding is not None:  # each rank holds a shard: the norm needs every rank's part
            where = f" (each rank's part of it summed over the {sharding.world_size} ranks)"
            params.update(group=sharding.group, world_size=sharding.world_size)
        node = add_node(
            context,
            NodeKind.CLIP_GRAD_NORM,
            gradients,
            [(f"{name}.clipped", context.graph.tensors[name].dtype) for name in gradients],
            Rule.CLIP_GRAD_NORM,
            f"the {len(gradients)} unscaled gradients scaled down together when their global "
            f"{clipping.norm_type:g}-norm{where} exceeds {clipping.max_norm:g}, as "
            "torch.nn.utils.clip_grad_norm_",
            params=params,
        )
        replace_gradients(context, node.name, gradients, node.outputs)
        return PassResult(modified=True, note=f"max_norm {clipping.max_norm:g}")
