"""torch.distributed for a data-parallel training step: the process group resolved into the
settings the ``all_reduce`` pass reads, and the replicas made identical when the step starts.

The collectives themselves are graph nodes (torch.distributed's functional collectives, built by
:mod:`graphamp.fx.dialect.lowering`), so the step stays one graph that ``torch.compile`` can
schedule.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch
import torch.distributed as dist

from graphamp.errors import GraphampError, TeardownWarning
from graphamp.training.distributed import (
    DEFAULT_BUCKET_BYTES,
    DEFAULT_FIRST_BUCKET_BYTES,
    GRAD_TYPES,
    GradientReduce,
)

# torch.distributed.nn.functional evaluates ``group=group.WORLD`` as default arguments when it
# is first imported, and torch.optim's optimizers and torch._dynamo import it lazily. Imported
# after init_process_group, those defaults hold the default process group past
# destroy_process_group: gloo's threads are still running when the interpreter finalizes,
# and a rank aborts at exit, now and then, with "terminate called without an active
# exception" (exit -6; pytorch/pytorch#190489). Imported here, with graphamp.fx, before a
# script starts its process group, the defaults hold None, which names the same group.
if dist.is_available() and not dist.is_initialized():
    import torch.distributed.nn


def gradient_reduce(
    process_group: object,
    grad_dtype: str | None,
    bucket_bytes: int | None,
    agree_found_inf: bool = False,
) -> GradientReduce | None:
    """The reduction over ``process_group`` (a ProcessGroup, or ``"world"`` for the default
    group), or None without one."""
    if process_group is None:
        if grad_dtype is not None or bucket_bytes is not None or agree_found_inf:
            raise GraphampError("grad_dtype, bucket_bytes and agree_found_inf need a process_group")
        return None
    require_initialized("process_group")
    warn_if_group_pinned(stacklevel=4)
    if isinstance(process_group, str) and process_group == "world":
        process_group = dist.group.WORLD
    if not isinstance(process_group, dist.ProcessGroup):
        raise GraphampError("process_group: a torch.distributed ProcessGroup or 'world'")
    dtype = grad_dtype or "float32"
    if dtype not in GRAD_TYPES:
        raise GraphampError(f"grad_dtype: one of {', '.join(GRAD_TYPES)} or None, got {dtype!r}")
    return GradientReduce(
        group=process_group.group_name,
        world_size=dist.get_world_size(process_group),
        dtype=dtype,
        # As DDP: under the default cap a small first bucket, under the user's one none.
        bucket_bytes=DEFAULT_BUCKET_BYTES if bucket_bytes is None else bucket_bytes,
        first_bucket_bytes=DEFAULT_FIRST_BUCKET_BYTES if bucket_bytes is None else None,
        agree_found_inf=agree_found_inf,
    )


def warn_if_group_pinned(stacklevel: int) -> None:
    """Say so when torch.distributed.nn was imported after init_process_group (graphamp.fx
    imported after it, say): its default arguments then keep the process group alive past
    destroy_process_group, and a rank can abort at exit."""
    import sys

    functional = sys.modules.get("torch.distributed.nn.functional")
    if functional is None:
        return
    pinned = any(
        isinstance(default, dist.ProcessGroup)
        for value in vars(functional).values()
        for default in (getattr(value, "__defaults__", None) or ())
    )
    if pinned:
        warnings.warn(
            "torch.distributed.nn was imported after init_process_group (torch.optim or "
            "torch._dynamo import it): it holds the process group past destroy_process_group, "
            "and a rank can abort at exit ('terminate called without an active exception'); "
            "import graphamp.fx before init_process_group",
            TeardownWarning,
            stacklevel=stacklevel,
        )


def require_initialized(what: str) -> None:
    """Refuse ``what`` (an option that needs other processes) before init_process_group."""
    if not dist.is_available() or not dist.is_initialized():
        raise GraphampError(
            f"{what}: torch.distributed is not initialized "
            "(call torch.distributed.init_process_group first, or run under torchrun)"
        )


def process_group_of(reduce: GradientReduce) -> dist.ProcessGroup:
    from torch.distributed.distributed_c10d import GroupName, _resolve_process_group

    return _resolve_process_group(GroupName(reduce.group))


def broadcast_from_first(reduce: GradientReduce, tensors: Iterable[torch.Tensor]) -> None:
    """Every rank's copy made the first rank's (in place), as DistributedDataParallel does
    with the parameters and buffers when it wraps a module: replicas start identical."""
    group = process_group_of(reduce)
    source = dist.get_global_rank(group, 0)
    for tensor in tensors:
        dist.broadcast(tensor, src=source, group=group)


WAIT = "_c10d_functional.wait_tensor"
COLLECTIVE = "_c10d_functional.all_reduce"
COLLECTIVES = (
    COLLECTIVE,
    "_c10d_functional.all_gather_into_tensor",
    "_c10d_functional.reduce_scatter_tensor",
)


def overlap_communication(module: torch.fx.GraphModule) -> int:
    """Reorder ``module``'s graph so that each collective is issued as soon as its inputs
    exist, and every node that does not depend on a collective's result runs before every node
    that does: the rest of backward then computes while the buckets already sent travel (the
    collectives are asynchronous until waited on), as DistributedDataParallel overlaps them.
    Nodes that write in place (functionalize's copies back onto buffers) stay with the later
    part. Returns how many nodes were moved after the first wait."""
    graph = module.graph
    _issue_early(graph)
    later: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if _waits_or_writes(node) or any(a in later for a in node.all_input_nodes):
            later.add(node)
    if not any(WAIT in str(n.target) for n in later):
        return 0
    output = next(n for n in graph.nodes if n.op == "output")
    for node in [n for n in graph.nodes if n in later and n.op != "output"]:
        output.prepend(node)  # in their order, after every earlier node
    graph.lint()
    module.recompile()
    return len(later)


def _waits_or_writes(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    schema = getattr(node.target, "_schema", None)
    target = str(node.target)
    if COLLECTIVE in target:  # all_reduce_ writes only the buffer its bucket made for it
        return False
    return WAIT in target or (schema is not None and schema.is_mutable)


def schedule_collectives(module: torch.fx.GraphModule) -> None:
    """Reorder a sharded step's graph so that each collective (the parameters' all-gathers,
    the gradients' reduce-scatters, the found_inf all-reduce) is issued as soon as its inputs
    exist, and waited for, with the copies out of its buffer, only right before the first
    node that reads a result: a bucket of parameters travels while the layers before it
    compute, a bucket of gradients while backward goes on."""
    graph = module.graph
    _issue_early(graph, COLLECTIVES)
    results: set[torch.fx.Node] = set()  # the waits, and what reads nothing else
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        inputs = node.all_input_nodes
        if WAIT in str(node.target) or (
            not _waits_or_writes(node)
            and any(a in results for a in inputs)
            and all(a in results or a.op in ("placeholder", "get_attr") for a in inputs)
        ):
            results.add(node)
    for node in [n for n in reversed(graph.nodes) if n in results and n.users]:
        order = {n: index for index, n in enumerate(graph.nodes)}
        min(node.users, key=order.__getitem__).prepend(node)
    graph.lint()
    module.recompile()


def _issue_early(graph: torch.fx.Graph, collectives: tuple[str, ...] = (COLLECTIVE,)) -> None:
    """Move every pure node a collective depends on right after the last of its inputs (in
    graph order, so each lands after its own inputs have moved)."""
    feeding: set[torch.fx.Node] = set()
    for node in reversed(graph.nodes):
        issues = node.op == "call_function" and any(c in str(node.target) for c in collectives)
        if issues or any(user in feeding for user in node.users):
            feeding.add(node)
    order = {node: index for index, node in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        if node not in feeding or node.op != "call_function" or _waits_or_writes(node):
            continue
        inputs = node.all_input_nodes
        if not inputs:
            continue
        last = max(inputs, key=order.__getitem__)
        if last.op == "placeholder":
            continue
        last.append(node)
        order = {n: index for index, n in enumerate(graph.nodes)}


def without_in_place_collectives(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``module`` with every in-place all-reduce made the functional one (a new result
    buffer): torch.compile functionalizes its graph and refuses an op whose output aliases
    its input; it then re-uses the buffer itself."""
    in_place = torch.ops._c10d_functional.all_reduce_.default
    changed = False
    for node in module.graph.nodes:
        if node.op == "call_function" and node.target is in_place:
            node.target = torch.ops._c10d_functional.all_reduce.default
            changed = True
    if changed:
        module.recompile()
    return module
