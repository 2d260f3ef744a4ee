"""Data-parallel training: the settings a training step's gradient passes read.

Plain settings (no torch at import), like :mod:`graphamp.training.scaling`: the dialect resolves the
user's process group into a :class:`GradientReduce`, the ``all_reduce`` pass
(:mod:`graphamp.passes.all_reduce`) puts it into the step graph's nodes, and the dialect builds
those nodes with its own collectives (torch.distributed's functional collectives for FX).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from graphamp.core.dtypes import BY_NAME
from graphamp.errors import GraphampError

GRAD_TYPES = ("float32", "float16", "bfloat16")
DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024  # DistributedDataParallel's default bucket_cap_mb
# DDP's first bucket under the default cap (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES): the
# gradients backward makes first start travelling while it computes the rest.
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024


@dataclass(frozen=True)
class GradientReduce:
    """Average the gradients over a process group of ``world_size`` ranks (named ``group``
    by the collectives library), sent as ``dtype``, in buckets of about ``bucket_bytes``
    (the first one, of the gradients backward makes first: ``first_bucket_bytes``, when
    given). ``agree_found_inf``: reduce the finite check's flag with MAX too, a collective
    each step that the average makes redundant (an inf or NaN on any rank is in every rank's
    average, which every rank holds bit for bit), as GradScaler under DDP relies on."""

    group: str
    world_size: int
    dtype: str = "float32"
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    first_bucket_bytes: int | None = None
    agree_found_inf: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in GRAD_TYPES:
            raise GraphampError(f"grad_dtype: one of {', '.join(GRAD_TYPES)} or None")
        if self.world_size < 1:
            raise GraphampError(f"the process group has {self.world_size} ranks")
        if self.bucket_bytes < 1:
            raise GraphampError(f"bucket_bytes must be positive, got {self.bucket_bytes}")
        if self.first_bucket_bytes is not None and self.first_bucket_bytes < 1:
            raise GraphampError(
                f"first_bucket_bytes must be positive, got {self.first_bucket_bytes}"
            )

    @property
    def item_bytes(self) -> int:
        return BY_NAME[self.dtype].numpy(0).itemsize

    def describe(self) -> str:
        return (
            f"mean over the {self.world_size} ranks of process group {self.group!r}, "
            f"sent as {self.dtype}"
        )


@dataclass(frozen=True)
class Sharding:
    """Parameters, gradients and optimizer state sharded over a process group of
    ``world_size`` ranks (named ``group``), as FSDP shards them: each rank holds rows
    ``[rank * c, (rank + 1) * c)`` of every parameter's first dimension (``c`` = the rows
    divided by the ranks, rounded up; the last ranks' shards may be shorter or empty). The
    step gathers the whole parameters before the forward pass, in buckets of about
    ``bucket_bytes`` (the first: ``first_bucket_bytes``, when given), and reduce-scatters the
    gradients as ``dtype`` (``dtype_source`` says who chose it); the ranks agree on the finite
    check with a MAX all-reduce (each sees only its shard)."""

    group: str
    world_size: int
    rank: int
    dtype: str = "float32"
    dtype_source: str = "grad_dtype"
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    first_bucket_bytes: int | None = None

    def __post_init__(self) -> None:
        GradientReduce(self.group, self.world_size, self.dtype, self.bucket_bytes)  # checks
        if not 0 <= self.rank < self.world_size:
            raise GraphampError(f"rank {self.rank} is not in a group of {self.world_size}")

    @property
    def item_bytes(self) -> int:
        return BY_NAME[self.dtype].numpy(0).itemsize

    def chunk(self, rows: int) -> int:
        """The rows of a whole shard of a parameter of ``rows`` rows (the last may be short)."""
        return -(-rows // self.world_size)

    def local_rows(self, rows: int, rank: int | None = None) -> int:
        """How many of ``rows`` rank ``rank`` (default: this one) holds."""
        chunk = self.chunk(rows)
        start = (self.rank if rank is None else rank) * chunk
        return max(0, min(chunk, rows - start))

    def describe(self) -> str:
        return (
            f"sharded over the {self.world_size} ranks of process group {self.group!r}, "
            f"gradients reduce-scattered as {self.dtype}"
        )


@dataclass(frozen=True)
class GradientClipping:
    """Scale the gradients by min(1, max_norm / (total norm + 1e-6)), the total norm being the
    ``norm_type``-norm of all of them together (``torch.nn.utils.clip_grad_norm_``)."""

    max_norm: float
    norm_type: float = 2.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_norm) and self.max_norm > 0):
            raise GraphampError(f"clip_grad_norm must be a positive number, got {self.max_norm}")
        if not (self.norm_type == math.inf or self.norm_type > 0):
            raise GraphampError(f"norm_type must be positive or inf, got {self.norm_type}")


def divide_factors(world: int, dtype: str) -> tuple[float, float]:
    """What a gradient reduce-scattered as ``dtype`` over ``world`` ranks is divided by before
    the reduction and after it, so that the mean is what each rank keeps: the world size
    after (the sum of every rank's whole gradient, divided on this rank's shard only: 1/world
    of the values, as FSDP2's average), except in float16, whose range is narrow: there, as
    FSDP2 does, about its square root before (the sum stays below float16's largest value)
    and the rest after (the shares stay above its smallest normal one)."""
    if dtype != "float16":
        return 1.0, float(world)
    before = 1
    while world % before == 0 and world / before > before:
        before *= 2
    return float(before), world / before


def buckets(
    sizes: list[tuple[str, int]], capacity: int, first: int | None = None
) -> list[list[str]]:
    """Consecutive names grouped as DistributedDataParallel's buckets: a group is closed once
    its bytes reach ``capacity`` (the first group's: ``first``, when given), the value that
    reaches it included."""
    groups: list[list[str]] = [[]]
    used, limit = 0, capacity if first is None else first
    for name, size in sizes:
        groups[-1].append(name)
        used += size
        if used >= limit:
            groups.append([])
            used, limit = 0, capacity
    return [group for group in groups if group]
