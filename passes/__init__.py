"""graphamp's passes: small units over an OpGraph, each with a contract (installed as
``graphamp.passes``). They never import onnx or torch.

Every module of this package that defines a pass registers it (:func:`base.register`); importing
the package imports them all, so :class:`PassManager` sees every pass without a hand-written
chain. The built-in ones:

* :mod:`classify` gives each node its initial class and reason,
* :mod:`cost` decides infer and clear ops by a minimum cut of Cast and weight bytes (ONNX),
* :mod:`paint` spreads precisions along the dataflow (TensorFlow's semantics),
* :mod:`promote` decides them by type promotion (autocast's semantics, PyTorch),
* :mod:`qdq` keeps the quantised ops of a QDQ model float32 where their quantisers are,
* :mod:`integer_values` keeps integers carried in float exact (quantised models' accumulators
  and requantisation, frame counts),
* :mod:`casts` turns the decisions into casts, weight conversions and cast clean-up,
* :mod:`reviewed` applies a reviewed plan's decisions instead, and refuses a drifted model,
* :mod:`loss_scale` adds loss scaling, unscaling, the finite check and the step guard to
  training-step graphs,
* :mod:`all_reduce` averages a data-parallel step's gradients over the ranks, agrees on
  skipping, and clips gradients by their global norm.
"""

from __future__ import annotations

import importlib
import pkgutil

from graphamp.passes.base import Fact, Pass, PassManager, PassResult, register, registered
from graphamp.passes.context import PassContext

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["Fact", "Pass", "PassContext", "PassManager", "PassResult", "register", "registered"]
