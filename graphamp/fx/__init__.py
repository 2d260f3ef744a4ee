"""The PyTorch dialect's Python API: convert a module to a mixed-precision GraphModule, or a
whole training step to one graph.

    >>> import graphamp.fx
    >>> gm, plan = graphamp.fx.convert(model, example_inputs)           # doctest: +SKIP
    >>> graphamp.fx.save(gm, "model.bf16.pt2")                          # doctest: +SKIP
    >>> gm, plan = graphamp.fx.load("model.bf16.pt2")                   # doctest: +SKIP
    >>> step = graphamp.fx.train_step(model, loss_fn, optimizer)        # doctest: +SKIP

The same passes as for ONNX decide (:mod:`graphamp.engine` over :class:`FxDialect`); the
default lists are PyTorch's own autocast lists for the target device.
"""

from __future__ import annotations

from graphamp.fx.backend import Backend, backend
from graphamp.fx.conversion import analyse, convert, cpu_has_native
from graphamp.fx.dialect.plugin import FxDialect
from graphamp.fx.saving import load, save
from graphamp.fx.train import train_step
from graphamp.fx.training.sharded import ShardedTrainStep
from graphamp.fx.training.step import TrainStep
from graphamp.training.scaling import DynamicLossScaling, StaticLossScaling

__all__ = [
    "Backend",
    "DynamicLossScaling",
    "FxDialect",
    "ShardedTrainStep",
    "StaticLossScaling",
    "TrainStep",
    "analyse",
    "backend",
    "convert",
    "cpu_has_native",
    "load",
    "save",
    "train_step",
]
