"""What :func:`graphamp.onnx.convert` returns."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from graphamp import engine
from graphamp.core import collector
from graphamp.onnx.io.infile import StreamedModel
from graphamp.onnx.io.writing import remember_source

if TYPE_CHECKING:
    import onnx_ir as ir


class Conversion(engine.Conversion):
    """The converted model, its plan, timings and the input's dataflow view.

    The converted model is held as a ``ModelProto``: :meth:`to_proto` returns it as it is,
    and ``model`` builds the onnx_ir model from it the first time it is asked for. A file
    converted holds its large weights where the input keeps them (a
    :class:`~graphamp.onnx.io.infile.StreamedModel`, which :meth:`save` writes as it reads
    them): they are read into memory the first time :meth:`to_proto` or ``model`` is asked
    for.
    """

    _converted: ir.Model | onnx.ModelProto | StreamedModel
    # The file converted, if a path was: the model built from it remembers it, so that
    # graphamp.onnx.save refuses to write over it unasked.
    read_from: Path | None = None

    @property
    def model(self) -> ir.Model:
        external = isinstance(self._converted, StreamedModel) and self._converted.external
        converted = self._materialised()
        if isinstance(converted, onnx.ModelProto):
            import onnx_ir as ir

            from graphamp.onnx.io.files import EXTERNAL_DATA_KEY

            with collector.paused():
                converted = self._converted = ir.serde.deserialize_model(converted)
            # saved as the input was: with external data where it had some
            converted.meta[EXTERNAL_DATA_KEY] = external
        if self.read_from is not None:
            remember_source(converted, self.read_from)
        return converted

    @model.setter
    def model(self, value: ir.Model | onnx.ModelProto | StreamedModel) -> None:
        self._converted = value

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        """Write the converted model as :func:`graphamp.onnx.save` does, its weights read
        (and rounded) from the input as they are written when they are still there."""
        from graphamp.onnx.io import files

        files.save(self._converted, path, overwrite=overwrite, read_from=self.read_from)

    def to_proto(self) -> onnx.ModelProto:
        """The converted model as a proto (the same object each time)."""
        converted = self._materialised()
        if isinstance(converted, onnx.ModelProto):
            return converted
        import onnx_ir as ir

        with collector.paused():
            return ir.to_proto(converted)

    def _materialised(self) -> ir.Model | onnx.ModelProto:
        """The converted model with its weights in memory (read from the input once)."""
        if isinstance(self._converted, StreamedModel):
            self._converted = self._converted.to_proto()
        return self._converted
