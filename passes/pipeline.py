"""The pipelines: which passes run, in which order, written once.

Everything that runs passes reads these lists: the engine (``MODEL``), a training step
(``STEP``), graphamp tune, which decides again with nodes kept float32 (``DECIDING``), and
docs/ARCHITECTURE.md, whose table a test holds to them. A new pass is written in its own module
and named here, where it must sit.

The model pipeline (a model to convert, any dialect):

1. ``fuse_norms`` rewrites decomposed norms into the fused ops the target has (ONNX).
2. The decisions: with a reviewed plan, ``reviewed_decisions`` takes every node's from it;
   otherwise ``policy_check`` warns about rules that match nothing, and ``DECIDING`` decides:
   ``classify`` gives each node its class; ``qdq``, ``saturation`` (which lets tanh-GELU's cube
   run low), ``integer_values``, ``range``, ``tuned`` and ``kept`` (a converted model's float32
   ops) settle what classify left open, each before precisions spread, so that deny spreads
   from what they keep float32; and the decide step spreads precisions over the infer and
   clear ops the way the policy's ``spread`` says (``DECIDE``); ``isolated`` then keeps float32
   an allow-list norm that every op around it leaves float32 (a Cast pair for nothing).
3. ``fp8`` picks float8 operands among the matrix ops decided low (with ``Options.fp8``).
4. ``casts`` turns the decisions into casts and weight conversions; ``reviewed_records``
   refuses edits that differ from the reviewed plan's; ``speculation_check`` measures the
   weights on disk no writer will check (``Options.speculate_weights``).

The training-step pipeline (a captured forward, backward and optimizer update): gradient
communication (``all_reduce``, or ``all_gather`` and ``reduce_scatter`` for a sharded step,
the float8 products and their scales between them: ``fp8_scaling``, with ``Options.fp8``),
loss scaling (``loss_scale``), gradient clipping, the finite check and the scale update, the
ranks' agreement on the finite check, and delayed float8 scaling's update after it
(``fp8_scale_update``).
"""

from __future__ import annotations

from graphamp.passes.all_reduce import AgreeFoundInfPass, AllReducePass, ClipGradNormPass
from graphamp.passes.base import Choice, Step
from graphamp.passes.casts import CastsPass
from graphamp.passes.classify import ClassifyPass
from graphamp.passes.context import PassContext
from graphamp.passes.cost import CostPass
from graphamp.passes.fp8 import Fp8Pass
from graphamp.passes.fp8_scaling import Fp8ScaleUpdatePass, Fp8ScalingPass
from graphamp.passes.fuse_norms import FuseNormsPass
from graphamp.passes.integer_values import IntegerValuesPass
from graphamp.passes.isolated import IsolatedPass
from graphamp.passes.kept import KeptPass
from graphamp.passes.loss_scale import FiniteCheckPass, LossScalePass, ScaleUpdatePass
from graphamp.passes.paint import PaintPass
from graphamp.passes.policy_check import PolicyCheckPass
from graphamp.passes.promote import PromotePass
from graphamp.passes.qdq import QdqPass
from graphamp.passes.range_rule import RangePass
from graphamp.passes.reviewed import ReviewedDecisionsPass, ReviewedRecordsPass
from graphamp.passes.saturation import SaturationPass
from graphamp.passes.shard import AllGatherPass, ReduceScatterPass
from graphamp.passes.speculation import SpeculationCheckPass
from graphamp.passes.spread_all import SpreadAllPass
from graphamp.passes.tuned import TunedPass


def _spread(context: PassContext) -> str:
    return context.policy.spread


def _decisions(context: PassContext) -> str:
    return "reviewed" if context.options.reviewed is not None else "new"


# How the infer and clear ops are decided, by the policy's spread (graphamp.policy.SPREADS): a
# minimum cut of the bytes Casts and weights move, TensorFlow's colouring, autocast's type
# promotion, or every op low that no rule keeps float32 (the peers' float16 tools).
DECIDE = Choice(
    "decide",
    "the policy's spread",
    _spread,
    {
        "cost": (CostPass,),
        "tensorflow": (PaintPass,),
        "autocast": (PromotePass,),
        "all": (SpreadAllPass,),
    },
)

# Every node's precision from the graph, the policy and the options: what tune runs again.
DECIDING: tuple[Step, ...] = (
    ClassifyPass,
    QdqPass,
    SaturationPass,
    IntegerValuesPass,
    RangePass,
    TunedPass,
    KeptPass,
    DECIDE,
    IsolatedPass,
)

MODEL: tuple[Step, ...] = (
    FuseNormsPass,
    Choice(
        "decisions",
        "a reviewed plan",
        _decisions,
        {
            "reviewed": (ReviewedDecisionsPass,),
            "new": (PolicyCheckPass, *DECIDING),
        },
    ),
    Fp8Pass,
    CastsPass,
    ReviewedRecordsPass,
    SpeculationCheckPass,
)

STEP: tuple[Step, ...] = (
    AllReducePass,
    AllGatherPass,
    # after the gather: a sharded step's float8 layers quantise the gathered weights
    Fp8ScalingPass,
    ReduceScatterPass,
    LossScalePass,
    ClipGradNormPass,
    FiniteCheckPass,
    ScaleUpdatePass,
    AgreeFoundInfPass,
    Fp8ScaleUpdatePass,
)
