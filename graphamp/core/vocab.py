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
    # a matrix op whose GEMM operands are float8 (E4M3); its output stays in the low type
    FLOAT8_E4M3FN = "float8_e4m3fn"
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
    # integers carried in float (passes/integer_values.py): a wide integer cast to float, and
    # float arithmetic whose result is used as an integer
    INTEGER_RANGE = "integer_range"
    INTEGER_VALUED = "integer_valued"
    CONTROL_FLOW = "control_flow"
    OPAQUE = "opaque"
    TYPE_UNKNOWN = "type_unknown"
    ALREADY_LOW = "already_low"
    KEPT = "kept"  # float32 in a model that already computes low: its own decision (kept.py)
    ISOLATED = "isolated"  # an allow-list norm with float32 all around: no Cast pair (isolated.py)
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
    # float8: why a matrix op decided low has float8 operands or keeps the low type
    # (passes/fp8.py; recorded in the plan's "fp8" section, not as the node's own rule)
    FP8 = "fp8"  # chosen: both operands quantised to float8
    FP8_SHAPE = "fp8_shape"  # K or N not a multiple of 16, unknown, or under the size table
    FP8_DENY = "fp8_deny"  # policy: fp8 deny names, the last matrix op, a MoE router
    FP8_OPERANDS = "fp8_operands"  # both operands activations (attention's products)
    FP8_RANGE = "fp8_range"  # calibration: too much of an operand would underflow its scale
    FP8_TUNED = "fp8_tuned"  # graphamp tune --fp8: the model misses its tolerance with it float8
    # an embedding table (a Gather's stored data) stored in 8 bits, one scale per row, with
    # Float8(embeddings=True): the gathered rows dequantised to the low type
    FP8_TABLE = "fp8_table"
    # float8 training steps: the scaling nodes a step pass adds
    FP8_AMAX = "fp8_amax"
    FP8_QUANTIZE = "fp8_quantize"
    FP8_SCALE_UPDATE = "fp8_scale_update"


DENY_SEEDS = frozenset({Rule.DENY, Rule.DENY_NAME, Rule.DENY_TENSOR, Rule.TUNED})
"""Rules that start a deny spread (and must never end low). ``tuned`` is one: tune prints its
set as ``deny_names``, which must give the same precisions."""

KEPT_FLOAT32 = DENY_SEEDS | {
    Rule.RANGE,
    Rule.INTEGER_RANGE,
    Rule.INTEGER_VALUED,
    Rule.KEPT,
    Rule.ISOLATED,
}
"""Rules whose nodes must never end low (checked between passes)."""

FP8_RULES = frozenset(
    {
        Rule.FP8,
        Rule.FP8_SHAPE,
        Rule.FP8_DENY,
        Rule.FP8_OPERANDS,
        Rule.FP8_RANGE,
        Rule.FP8_TUNED,
        Rule.FP8_TABLE,
    }
)
"""The rules of a float8 decision (:class:`~graphamp.plans.records.Fp8Decision`)."""
