"""Sharded training steps (FSDP): each rank holds a shard of every parameter, gradient and
optimizer state; the whole parameters exist only inside the step, as passes of the ``step``
pipeline.

The dialect traces the step with the whole parameters as graph inputs of their own, which
only the forward and backward passes read, and the optimizer update on the shards; the
``whole_parameters`` option names, for each whole parameter, the shard it stands for.

* **all_gather** (with ``shard`` settings): each whole parameter gathered from every rank's
  shard, in buckets of about ``bucket_bytes`` in the order the forward pass first reads them,
  so that a bucket's readers wait only for it. A parameter that only low-precision ops read
  (every reader a cast to the policy's low type: the converted forward casts float32 master
  weights at use) is gathered in that type: each rank casts its shard, half the bytes travel,
  and the casts go. One read by a float32 op is gathered as it is stored. The whole
  parameters stay until backward has read them (FSDP's ``reshard_after_forward=False``).
* **reduce_scatter**: the gradients averaged over the ranks in ``dtype``, each rank keeping
  the rows of its own shard (half the bytes of an all-reduce of the same gradients), in
  buckets in the order backward makes them. The sum is divided by the world size on this
  rank's shard (1/world of the values; in float16 about the square root of the world size
  before the sum and the rest after, as FSDP2 does: neither overflow nor flush). Under loss
  scaling the scaled gradients travel and are unscaled after, so small values survive a
  low-precision reduction.
* The finite check then sees only this rank's shards, so the ranks agree on it with a MAX
  all-reduce of ``found_inf`` (:mod:`graphamp.passes.all_reduce`'s ``all_reduce_found_inf``,
  which a sharded step always runs), as ``ShardedGradScaler`` does.
"""

from __future__ import annotations

from graphamp.core.dtypes import BY_NAME
from graphamp.core.graph import NodeKind, OpGraph, Role, TensorInfo
from graphamp.core.vocab import Precision, Rule
from graphamp.errors import InternalError
from graphamp.passes.all_reduce import (
    average_in_buckets,
    elements,
    plural,
    scaled_note,
)
from graphamp.passes.base import Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.passes.loss_scale import add_node, reroute
from graphamp.training.distributed import Sharding, buckets, divide_factors


def _item_bytes(dtype: str) -> int:
    return int(BY_NAME[dtype].numpy(0).itemsize)


def _label(context: PassContext, names: list[str]) -> str:
    """The model's names of the parameters ``names`` stand for (the first few)."""
    labels = {whole: name for whole, (_, name) in context.options.whole_parameters.items()}
    shown = [labels.get(name, name) for name in names[:4]]
    return ", ".join(shown) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _gather_type(context: PassContext, whole: TensorInfo, low: str) -> tuple[str, str]:
    """The type ``whole`` travels in, and why: the low type when every reader is a cast to it."""
    graph = context.graph
    readers = [graph.nodes[node] for node, _ in graph.consumers(whole.name)]
    other = next((n for n in readers if n.kind is not NodeKind.CAST or n.cast_to != low), None)
    if other is None:
        return low, f"only {low} ops read them"
    return whole.dtype, f"{other.name} reads {_label(context, [whole.name])} in {whole.dtype}"


def _first_reads(graph: OpGraph, wholes: list[TensorInfo]) -> list[TensorInfo]:
    """``wholes`` in the order the graph first reads them (through the casts)."""
    position = {name: index for index, name in enumerate(graph.nodes)}

    def first(tensor: TensorInfo) -> int:
        readers = [node for node, _ in graph.consumers(tensor.name)]
        for node in list(readers):
            if graph.nodes[node].kind is NodeKind.CAST:
                readers += [n for n, _ in graph.consumers(graph.nodes[node].outputs[0])]
        return min((position[n] for n in readers), default=len(position))

    return sorted(wholes, key=first)


class AllGatherPass(Pass):
    """Gather the whole parameters from the ranks' shards (see the module docstring)."""

    name = "all_gather"

    def applies(self, context: PassContext) -> bool:
        return context.options.shard is not None and bool(context.options.whole_parameters)

    def run(self, context: PassContext) -> PassResult:
        sharding = context.options.shard
        assert sharding is not None  # applies() checked it
        graph, low = context.graph, context.policy.dtype
        named = context.options.whole_parameters
        wholes = _first_reads(graph, [graph.tensors[name] for name in named])
        read = [w for w in wholes if graph.consumers(w.name)]
        typed = {w.name: _gather_type(context, w, low) for w in read}
        groups: list[list[str]] = []
        for dtype in dict.fromkeys(dtype for dtype, _ in typed.values()):  # first read first
            same = [w for w in read if typed[w.name][0] == dtype]
            sizes = [(w.name, elements(w) * _item_bytes(dtype)) for w in same]
            groups += buckets(sizes, sharding.bucket_bytes, sharding.first_bucket_bytes)
        total = 0
        for index, names in enumerate(groups):
            dtype = typed[names[0]][0]
            total += self._gather(context, sharding, index, len(groups), names, dtype, typed)
        for whole in wholes:  # nothing reads the whole parameters as graph inputs any more
            graph.graph_inputs.remove(whole.name)
            context.script.removed_inputs.append(whole.name)
        return PassResult(
            modified=True, note=f"{len(groups)} buckets, {total} bytes: {sharding.describe()}"
        )

    def _gather(
        self,
        context: PassContext,
        sharding: Sharding,
        index: int,
        count: int,
        names: list[str],
        dtype: str,
        typed: dict[str, tuple[str, str]],
    ) -> int:
        """Add bucket ``index``'s all_gather node and give its outputs to the readers; the
        bytes each rank receives."""
        graph = context.graph
        wholes = [graph.tensors[name] for name in names]
        item = _item_bytes(dtype)
        rows = [_rows(w) for w in wholes]
        received = sum(
            sharding.chunk(r) * sharding.world_size * (elements(w) // max(r, 1)) * item
            for r, w in zip(rows, wholes, strict=True)
        )
        low = dtype != wholes[0].dtype
        why = typed[names[0]][1] if low else "; ".join(dict.fromkeys(typed[n][1] for n in names))
        halved = f" (half of {wholes[0].dtype}'s)" if low else ""
        node = add_node(
            context,
            NodeKind.ALL_GATHER,
            [context.options.whole_parameters[name][0] for name in names],
            [(f"{name}.gathered", dtype) for name in names],
            Rule.ALL_GATHER,
            f"bucket {index + 1} of {count}: {plural(len(names), 'parameter')} "
            f"({_label(context, names)}) gathered whole from the {sharding.world_size} ranks' "
            f"shards, {received} bytes received as {dtype}{halved}: {why}",
            params={
                "group": sharding.group,
                "world_size": sharding.world_size,
                "dtype": dtype,
                "rows": ",".join(str(r) for r in rows),
            },
            name=f"all_gather.{index}",
            precision=Precision(dtype),
        )
        for whole, gathered in zip(wholes, node.outputs, strict=True):
            if low:  # the casts' readers read the gathered value; the dialect drops the
                # casts (they stay in the neutral graph, read by nothing)
                for cast, _ in graph.consumers(whole.name):
                    reroute(context, graph.nodes[cast].outputs[0], gathered, skip=cast)
                    context.script.remove_nodes.append(cast)
            else:
                reroute(context, whole.name, gathered, skip=node.name)
        return received


class ReduceScatterPass(Pass):
    """Average the gradients over the ranks, each keeping its shard (module docstring)."""

    name = "reduce_scatter"

    def applies(self, context: PassContext) -> bool:
        sharded = context.options.shard is not None
        return sharded and bool(context.graph.with_role(Role.GRADIENT))

    def run(self, context: PassContext) -> PassResult:
        sharding = context.options.shard
        assert sharding is not None  # applies() checked it
        before, after = divide_factors(sharding.world_size, sharding.dtype)
        divided = " and ".join(
            part
            for part, factor in (
                (f"divided by {before:g} before the sum", before),
                (f"the sum divided by {after:g}", after),
            )
            if factor != 1
        )
        scaled = scaled_note(context, sharding.dtype)
        params: dict[str, float | str] = {
            "group": sharding.group,
            "world_size": sharding.world_size,
            "rank": sharding.rank,
            "dtype": sharding.dtype,
        }
        return average_in_buckets(
            context,
            sharding,
            NodeKind.REDUCE_SCATTER,
            Rule.REDUCE_SCATTER,
            "shard",
            params,
            lambda sent: (
                f", each rank keeping the rows of its own shard ({divided}); {sent} "
                f"bytes sent as {sharding.dtype} ({sharding.dtype_source}){scaled}"
            ),
        )


def _rows(tensor: TensorInfo) -> int:
    """The rows of a sharded weight (its first dim, 1 for a scalar), which are known."""
    if not tensor.shape:
        return 1
    first = tensor.shape[0]
    if not isinstance(first, int):
        raise InternalError(f"{tensor.name}: sharded by rows of unknown count {first!r}")
    return first
