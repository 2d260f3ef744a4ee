"""Data-parallel training: the settings a training step's gradient passes read.

Plain settings (no torch at import), like :mod:`graphamp.scaling`: the dialect resolves the
user's process group into a :class:`GradientReduce`, the ``all_reduce`` pass
(:mod:`graphamp.passes.all_reduce`) puts it into the step graph's nodes, and the dialect builds
those nodes with its own collectives (torch.distributed's functional collectives for FX).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from graphamp.dtypes import BY_NAME
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
