"""What :func:`graphamp.onnx.convert` returns."""

from __future__ import annotations

from dataclasses import dataclass

import onnx
import onnx_ir as ir

from graphamp import collector, engine


@dataclass
class Conversion(engine.Conversion):
    """The converted onnx_ir model, its plan, timings and the input's dataflow view."""

    model: ir.Model

    def to_proto(self) -> onnx.ModelProto:
        with collector.paused():
            return ir.to_proto(self.model)
