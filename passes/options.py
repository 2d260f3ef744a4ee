"""Options: what one run hands the passes besides the graph and the policy, as one frozen,
typed object.

The :class:`~graphamp.policy.policy.Policy` says how to decide (the dtype, the lists, the name
rules, the spread) and is recorded in every plan, so that a plan can be applied again as it is.
Options are the rest of a run's inputs, which a plan does not record as settings: data that
feeds a rule (calibrated ranges, the nodes tune kept, a reviewed plan), how the run behaves
(``strict``, the speculative weight check), and a training step's settings (loss scaling,
gradient communication), whose effect a step plan records as nodes of its own. None of them
changes what the policy means, which is why none lives in the Policy.

Everything defaults to off: ``Options()`` runs the model pipeline with no optional pass.
Callers build a variant with :func:`dataclasses.replace`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphamp.numerics.ranges import Ranges
    from graphamp.plans.plan import Plan
    from graphamp.training.distributed import GradientClipping, GradientReduce, Sharding
    from graphamp.training.float8 import Float8
    from graphamp.training.scaling import LossScaling


@dataclass(frozen=True, kw_only=True)
class Options:
    """A run's inputs to the passes (see the module docstring); each field names the pass
    that reads it."""

    # -- the model pipeline ------------------------------------------------------------------
    # Calibrated ranges: the ``range`` pass keeps float32 each op whose values leave the type.
    ranges: Ranges | None = None
    # The ``range`` rule's margin (None: the dtype's default, graphamp.numerics.ranges.MARGIN).
    range_margin: float | None = None
    # Nodes graphamp tune found must stay float32 (the ``tuned`` pass, rule ``tuned``).
    tuned: frozenset[str] = frozenset()
    # A reviewed plan whose decisions are applied instead of new ones (``reviewed_decisions``,
    # ``reviewed_records``); ``reviewed_where`` names it in errors (its file), else its model.
    reviewed: Plan | None = None
    reviewed_where: str = ""
    # A policy rule that matches nothing is an error rather than a warning (``policy_check``).
    strict: bool = False
    # A graph with ops already low holds its float32 ops float32 (the ``kept`` pass): a
    # converted model's decisions. Off for graphs whose low values are no such decision:
    # torch.compile's graphs after a graph break read the previous graph's low outputs.
    keep_model_decisions: bool = True
    # Weights on disk are not read by the passes: each is assumed to fit, the writer checks it
    # as it converts it, and ``speculation_check`` measures those no writer converts
    # (graphamp.passes.weights.WeightRanges). Only the engine's convert_and_save sets it,
    # since only it can start over when an assumption fails.
    speculate_weights: bool = False
    # Float8 operands for matrix ops decided low (the ``fp8`` pass); recorded in the plan as
    # its ``fp8_settings``.
    fp8: Float8 | None = None
    # Matrix ops graphamp tune --fp8 found must keep the low type, each with the reason its
    # search measured (the ``fp8`` pass, rule ``fp8_tuned``).
    fp8_tuned: Mapping[str, str] = field(default_factory=dict)

    # -- the training-step pipeline ------------------------------------------------------------
    # The step's loss scaling (``loss_scale``, ``finite_check``, ``scale_update``).
    loss_scaling: LossScaling | None = None
    # Data parallelism: gradients averaged over the ranks (``all_reduce``).
    all_reduce: GradientReduce | None = None
    # Gradients scaled down to a largest global norm (``clip_grad_norm``).
    clip_grad_norm: GradientClipping | None = None
    # Sharded parameters and gradients (``all_gather``, ``reduce_scatter``), and for each whole
    # parameter's graph input: (its shard's graph input, the parameter's name in the model).
    shard: Sharding | None = None
    whole_parameters: Mapping[str, tuple[str, str]] = field(default_factory=dict)
