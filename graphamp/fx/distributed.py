"""torch.distributed for a data-parallel training step: the process group resolved into the
settings the ``all_reduce`` pass reads, and the replicas made identical when the step starts.

The collectives themselves are graph nodes (torch.distributed's functional collectives, built by
:mod:`graphamp.fx.lowering`), so the step stays one graph that ``torch.compile`` can schedule.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from graphamp.distributed import DEFAULT_BUCKET_BYTES, GRAD_TYPES, GradientReduce
from graphamp.errors import GraphampError


def gradient_reduce(
    process_group: object, grad_dtype: str | None, bucket_bytes: int | None
) -> GradientReduce | None:
    """The reduction over ``process_group`` (a ProcessGroup, or ``"world"`` for the default
    group), or None without one."""
    if process_group is None:
        if grad_dtype is not None or bucket_bytes is not None:
            raise GraphampError("grad_dtype and bucket_bytes need a process_group")
        return None
    if not dist.is_available() or not dist.is_initialized():
        raise GraphampError(
            "process_group: torch.distributed is not initialized "
            "(call torch.distributed.init_process_group first, or run under torchrun)"
        )
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
        bucket_bytes=DEFAULT_BUCKET_BYTES if bucket_bytes is None else bucket_bytes,
    )


def process_group_of(reduce: GradientReduce) -> dist.ProcessGroup:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(reduce.group)


def broadcast_from_first(reduce: GradientReduce, tensors: Iterable[torch.Tensor]) -> None:
    """Every rank's copy made the first rank's (in place), as DistributedDataParallel does
    with the parameters and buffers when it wraps a module: replicas start identical."""
    group = process_group_of(reduce)
    source = dist.get_global_rank(group, 0)
    for tensor in tensors:
        dist.broadcast(tensor, src=source, group=group)
