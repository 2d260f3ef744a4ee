"""What :func:`graphamp.onnx.convert` returns."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import onnx

from graphamp import collector, engine

if TYPE_CHECKING:
    import onnx_ir as ir


class Conversion(engine.Conversion):
    """The converted model, its plan, timings and the input's dataflow view.

    A ``ModelProto`` converted directly (``OnnxDialect(direct=True)``) is held as the new
    proto: :meth:`to_proto` returns it as it is, and ``model`` builds the onnx_ir model from
    it the first time it is asked for.
    """

    _converted: ir.Model | onnx.ModelProto

    @property  # type: ignore[override]
    def model(self) -> ir.Model:
        if isinstance(self._converted, onnx.ModelProto):
            import onnx_ir as ir

            with collector.paused():
                self._converted = ir.serde.deserialize_model(self._converted)
        return self._converted

    @model.setter
    def model(self, value: Any) -> None:
        self._converted = value

    def to_proto(self) -> onnx.ModelProto:
        """The converted model as a proto (the same object each time on the direct path)."""
        if isinstance(self._converted, onnx.ModelProto):
            return self._converted
        import onnx_ir as ir

        with collector.paused():
            return ir.to_proto(self._converted)
