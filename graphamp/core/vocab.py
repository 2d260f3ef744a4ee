"""The engine's vocabulary: precisions, rule keys and op-list names as enums.

They are ``StrEnum``s: each member *is* its string, so plans, logs and JSON read the same words
as before (``"float16"``, ``"deny_spread"``), and a plan loaded from JSON compares equal to one
made in memory. New code names members (``Rule.DENY_SPREAD``), never bare strings.
"""

from __future__ import annotations

import enum

TARGET_TYPES = ("float16", "bfloat16")  # what a conversion can target


class Precision(enum.StrEnum):
    """What a node computes in, as a plan records it."""

    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    NONE = "none"  # no float math: shape plumbing, integer ops, casts already in the model


class ListName(enum.StrEnum):
    """The four op lists a policy holds; the order is the order they are searched in."""

    ALLOW = "allow"
    INFER = "infer"
    CLEAR = "clear"
    DENY = "deny"


class Rule(enum.StrEnum):
    """The stable key of the rule behind a decision (what CI filters and diffs on)."""

    # the op lists
    ALLOW = "allow"
    INFER = "infer"
    CLEAR = "clear"
    DENY = "deny"
    UNLISTED = "unlisted"
    # spreading along the dataflow
    DENY_SPREAD = "deny_spread"
    # name rules
    ALLOW_NAME = "allow_name"
    DENY_NAME = "deny_name"
    DENY_TENSOR = "deny_tensor"
    # what the graph itself says
    SCHEMA = "schema"
    NO_KERNEL = "no_kernel"
    WEIGHT_RANGE = "weight_range"
    RANGE = "range"  # a value beyond the target's range on calibration data
    TUNED = "tuned"  # kept float32 by graphamp tune's search
    QDQ = "qdq"  # a quantised op between float32 quantisers (passes/qdq.py)
    CONTROL_FLOW = "control_flow"
    OPAQUE = "opaque"
    TYPE_UNKNOWN = "type_unknown"
    ALREADY_LOW = "already_low"
    FLOAT64 = "float64"
    NO_FLOAT = "no_float"
    CAST = "cast"
    # training steps: the nodes the training passes add
    LOSS_SCALE = "loss_scale"
    UNSCALE = "unscale"
    FINITE_CHECK = "finite_check"
    STEP_GUARD = "step_guard"
    SCALE_UPDATE = "scale_update"
    SKIP_COUNT = "skip_count"
    ALL_REDUCE = "all_reduce"
    CLIP_GRAD_NORM = "clip_grad_norm"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"


DENY_SEEDS = frozenset({Rule.DENY, Rule.DENY_NAME, Rule.DENY_TENSOR, Rule.TUNED})
"""Rules that start a deny spread (and must never end low). ``tuned`` is one: tune prints its
set as ``deny_names``, which must give the same precisions."""

KEPT_FLOAT32 = DENY_SEEDS | {Rule.RANGE}
"""Rules whose nodes must never end low (checked between passes)."""
