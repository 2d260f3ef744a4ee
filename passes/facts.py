"""The facts passes establish and require (see :mod:`graphamp.passes.base`)."""

from __future__ import annotations

import enum


class Fact(enum.StrEnum):
    """What a pass establishes about the context."""

    CLASSIFIED = "classified"  # every node has its initial class (decisions)
    DECIDED = "decided"  # every node has its final precision
    FP8_DECIDED = "fp8_decided"  # every matrix op decided low has its float8 decision
    EDITS = "edits"  # the edit script and cast/weight records exist
    LOSS_SCALED = "loss_scaled"  # a step graph's backward seed is scaled, gradients unscaled
    FINITE_CHECKED = "finite_checked"  # a step graph's updates are guarded by a finite check
    FP8_SCALED = "fp8_scaled"  # a step graph's float8 GEMM marks are scaled GEMMs
