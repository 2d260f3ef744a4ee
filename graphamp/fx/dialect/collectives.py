"""Building a sharded step's collective nodes (``all_gather``, ``reduce_scatter``) in aten ops
and torch.distributed's functional collectives, as :mod:`graphamp.fx.dialect.lowering` builds the
others.

A rank holds rows ``[rank * c, (rank + 1) * c)`` of each parameter (``c`` the rows divided by
the ranks, rounded up; the last shards may be short or empty), FSDP's layout. On the wire
every rank's piece is ``c`` rows: a short shard travels padded with zeros, and the padding is
cut off the gathered parameter; a gradient is padded to ``world * c`` rows before it is
reduce-scattered, and each rank keeps its shard's rows of the result. Each bucket is one flat
buffer, one collective and one wait.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from graphamp.core.graph import OpNode
from graphamp.fx.dialect.types import torch_dtype
from graphamp.training.distributed import divide_factors

Lowering = Callable[..., Sequence[torch.Tensor] | torch.Tensor]


def _chunk(rows: int, world: int) -> int:
    return -(-rows // world)


def _padded(value: torch.Tensor, rows: int) -> torch.Tensor:
    """``value`` with zero rows appended up to ``rows``."""
    missing = rows - value.shape[0]
    if missing <= 0:
        return value
    return torch.cat([value, value.new_zeros((missing, *value.shape[1:]))])


def all_gather(node: OpNode) -> Lowering:
    """The whole parameters of a bucket from every rank's shard, in the node's type."""
    from torch.distributed import _functional_collectives as collectives

    group, world = str(node.params["group"]), int(node.params["world_size"])
    sent_as = torch_dtype(str(node.params["dtype"]))
    rows = [int(r) for r in str(node.params["rows"]).split(",")]

    def gathered(*shards: torch.Tensor) -> list[torch.Tensor]:
        pieces = [
            _padded(shard.to(sent_as), _chunk(whole, world)).reshape(-1)
            for shard, whole in zip(shards, rows, strict=True)
        ]
        flat = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        ops = torch.ops._c10d_functional
        received = collectives.wait_tensor(ops.all_gather_into_tensor(flat, world, group))
        parts = received.view(world, -1).split([piece.numel() for piece in pieces], dim=1)
        wholes = []
        for part, shard, whole in zip(parts, shards, rows, strict=True):
            full = part.reshape(world * _chunk(whole, world), *shard.shape[1:])
            wholes.append(full[:whole] if full.shape[0] != whole else full)
        return wholes

    return gathered


def reduce_scatter(node: OpNode) -> Lowering:
    """A bucket of gradients averaged over the ranks in the node's type; this rank's rows of
    each, in the gradient's own type."""
    from torch.distributed import _functional_collectives as collectives

    group, world = str(node.params["group"]), int(node.params["world_size"])
    rank = int(node.params["rank"])
    sent_as = torch_dtype(str(node.params["dtype"]))

    before, after = divide_factors(world, str(node.params["dtype"]))

    def scattered(*gradients: torch.Tensor) -> list[torch.Tensor]:
        # Divided by the world size, after the sum on this rank's shard (in float16 partly
        # before it: graphamp.training.distributed.divide_factors), so that what it keeps is the
        # mean.
        pieces = [
            _padded((g / before if before != 1 else g).to(sent_as), world * _chunk(len(g), world))
            for g in gradients
        ]
        rows = [piece.reshape(world, -1) for piece in pieces]
        flat = (torch.cat(rows, dim=1) if len(rows) > 1 else rows[0]).reshape(-1)
        ops = torch.ops._c10d_functional
        mine = collectives.wait_tensor(ops.reduce_scatter_tensor(flat, "sum", world, group))
        shards = []
        for part, g in zip(mine.split([r.shape[1] for r in rows]), gradients, strict=True):
            chunk = _chunk(g.shape[0], world)
            local = max(0, min(chunk, g.shape[0] - rank * chunk))
            shard = part.view(chunk, *g.shape[1:])
            shard = shard[:local] if local < chunk else shard
            shards.append((shard / after if after != 1 else shard).to(g.dtype))
        return shards

    return scattered


def over_ranks(value: torch.Tensor, op: str, group: str) -> torch.Tensor:
    """``value`` (a 0-d tensor) reduced over the group with ``op`` ("sum" or "max")."""
    from torch.distributed import _functional_collectives as collectives
    from torch.distributed.distributed_c10d import GroupName

    sent = value.reshape(1)
    return collectives.wait_tensor(collectives.all_reduce(sent, op, GroupName(group)))[0]
