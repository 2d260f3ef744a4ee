"""graphamp's passes: small units over an OpGraph, each with a contract (installed as
``graphamp.passes``). They never import onnx or torch.

Which passes run, in which order, is written once, in :mod:`graphamp.passes.pipeline`: the
model pipeline (``MODEL``), the training-step one (``STEP``) and the deciding passes tune runs
again (``DECIDING``). The built-in passes:

* :mod:`classify` gives each node its initial class and reason,
* :mod:`cost` decides infer and clear ops by a minimum cut of Cast and weight bytes (ONNX),
* :mod:`paint` spreads precisions along the dataflow (TensorFlow's semantics),
* :mod:`promote` decides them by type promotion (autocast's semantics, PyTorch),
* :mod:`spread_all` runs low every op that no rule keeps float32 (the peers' float16 tools),
* :mod:`qdq` keeps the quantised ops of a QDQ model float32 where their quantisers are,
* :mod:`integer_values` keeps integers carried in float exact (quantised models' accumulators
  and requantisation, frame counts),
* :mod:`fp8` picks float8 operands for matrix ops decided low,
* :mod:`kept` keeps a converted model's float32 ops float32 when it is converted again,
* :mod:`casts` turns the decisions into casts, weight conversions and cast clean-up,
* :mod:`reviewed` applies a reviewed plan's decisions instead, and refuses a drifted model,
* :mod:`loss_scale` adds loss scaling, unscaling, the finite check and the step guard to
  training-step graphs,
* :mod:`all_reduce` averages a data-parallel step's gradients over the ranks, agrees on
  skipping, and clips gradients by their global norm.
"""

from __future__ import annotations

from graphamp.passes.base import Choice, Fact, Pass, PassManager, PassResult
from graphamp.passes.context import PassContext
from graphamp.passes.options import Options

__all__ = ["Choice", "Fact", "Options", "Pass", "PassContext", "PassManager", "PassResult"]
