"""The ONNX dialect: ``.onnx`` files, ``onnx.ModelProto`` and ``onnx_ir.Model`` objects."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np
import onnx

from graphamp.dialects.base import Dialect, ReadGraph
from graphamp.errors import GraphampError
from graphamp.lists import matrix_ops
from graphamp.numerics.inputs import InputSpec
from graphamp.numerics.ranges import Ranges
from graphamp.onnx.dialect import reader, writer
from graphamp.onnx.io import files, infile
from graphamp.onnx.io.infile import StreamedModel
from graphamp.onnx.io.proto_model import ProtoModel
from graphamp.onnx.io.writing import written_files
from graphamp.plans.edits import EditScript
from graphamp.policy.policy import Policy

if TYPE_CHECKING:
    import onnx_ir as ir


class OnnxDialect(Dialect):
    """``load`` reads a file or ``ModelProto`` (an ``onnx_ir.Model`` given directly is taken
    as its proto) into a :class:`~graphamp.onnx.io.proto_model.ProtoModel` and never changes it;
    ``apply`` returns a new ``ModelProto``, or for a file whose weights stay where they are
    until written, a :class:`~graphamp.onnx.io.infile.StreamedModel`. Nothing of onnx_ir is
    built or serialised on the way (docs/ARCHITECTURE.md, "The ONNX dialect's reader and
    writer").

    onnxruntime is imported only where it is used: by the runtime check, verification and
    calibration.
    """

    name = "onnx"
    lists = "onnx"
    matrix_ops = matrix_ops("onnx")

    def accepts(self, source: object) -> bool:
        return isinstance(source, onnx.ModelProto) or _is_ir_model(source)

    def load(self, source: object) -> ProtoModel:
        if isinstance(source, str | Path):
            return files.read_file(source)
        if isinstance(source, onnx.ModelProto):
            return files.read_proto(source)
        if _is_ir_model(source):
            import onnx_ir as ir

            return files.read_proto(ir.to_proto(source))
        raise GraphampError(f"expected a path or an ONNX model, got {type(source).__name__}")

    def read(self, model: ProtoModel, policy: Policy) -> ReadGraph:
        from graphamp.onnx.validation import declared

        # the writer puts each call site's body inline instead of a function copy
        model.inline_functions = policy.inline_functions
        read = reader.read(model, policy.dtype, policy.target)
        declared.warn(model.repaired)
        return read

    def apply(self, read: ReadGraph, script: EditScript) -> onnx.ModelProto | StreamedModel:
        if script.fp8 is not None:
            from graphamp.onnx.dialect import float8

            float8.refuse_quantised(read.graph, "the model")
        model = writer.apply(read, script)
        if script.fp8 is not None:
            model = float8.emit(model, read, script.fp8.scales, script.fp8.dtype)
        return _checker_ready(model)

    def save(self, model: ir.Model | onnx.ModelProto | StreamedModel, path: Path) -> None:
        files.save(model, path)

    def save_unchanged(self, source: Path, path: Path) -> bool:
        from graphamp.onnx.io.unchanged import copy_if_sound

        return copy_if_sound(Path(source), Path(path))

    def files(self, path: Path) -> list[Path]:
        from graphamp.onnx.io.locations import external_data_files

        return [Path(path), *external_data_files(Path(path))]

    def written_files(self, path: Path) -> list[Path]:
        return written_files(Path(path))

    def check_provider(self, provider: str) -> None:
        from graphamp.onnx.numerics import runtime

        runtime.check_provider(provider)

    def check_runtime(self, original: Path, converted: Path) -> list[str]:
        from graphamp.onnx.numerics import runtime

        return runtime.check_loads(Path(original), Path(converted))

    def input_specs(self, model: Any) -> list[InputSpec]:
        from graphamp.onnx.numerics import runtime

        if isinstance(model, str | Path):  # the inputs and the weights' dims: no weight read
            mapped = infile.read(model) if Path(model).is_file() else None
            if mapped is not None:
                return runtime.input_specs(mapped.proto)
        return runtime.input_specs(_proto(model, with_data=False))

    def run(
        self, model: Any, feeds: dict[str, np.ndarray], *, provider: str = "cpu"
    ) -> tuple[dict[str, np.ndarray], str]:
        from graphamp.onnx.numerics import runtime

        return runtime.run(_proto(model, with_data=True), feeds, provider)

    def calibrate(
        self, model: Any, batches: Iterable[dict[str, np.ndarray]], *, histograms: bool = False
    ) -> Ranges:
        from graphamp.onnx.numerics.calibration import calibrate_proto

        return calibrate_proto(
            _proto(model, with_data=True), batches, label=self.label(model), histograms=histograms
        )


def _proto(model: Any, *, with_data: bool) -> onnx.ModelProto:
    """A ModelProto of a model or a saved file (its external data loaded when running)."""
    if isinstance(model, str | Path):
        try:
            return onnx.load(str(model), load_external_data=with_data)
        except Exception as exc:  # protobuf and file errors alike
            raise GraphampError(f"{model}: cannot read the model ({exc})") from None
    if _is_ir_model(model):
        import onnx_ir as ir

        return ir.to_proto(model)
    if isinstance(model, StreamedModel):
        return model.to_proto()
    return model


def _is_ir_model(source: object) -> TypeGuard[ir.Model]:
    """Whether ``source`` is an onnx_ir model (without importing onnx_ir: one can only exist
    once something imported it)."""
    ir = sys.modules.get("onnx_ir")
    return ir is not None and isinstance(source, ir.Model)


def _checker_ready(model: Any) -> Any:
    """``model`` with what onnxruntime overlooks and the checker does not settled: its IR
    version (at least 3, the first with opset_import; :func:`_initializers_need_no_inputs`),
    a main graph without a name, named ``main_graph`` (the name torch.onnx gives), and graph
    outputs without a type or shape (:mod:`graphamp.onnx.dialect.output_types`)."""
    from graphamp.onnx.dialect.output_types import declare_outputs

    declare_outputs(model)
    proto = getattr(model, "proto", model)  # a StreamedModel's proto holds its graph
    if not proto.graph.name:
        proto.graph.name = "main_graph"
    if proto.ir_version < 3:  # IR 1 and 2 had no opset_import, which every model read has
        proto.ir_version = 3
    return _initializers_need_no_inputs(model)


def _initializers_need_no_inputs(model: Any) -> Any:
    """IR version 3 makes every initializer a graph input too; onnxruntime loads a model that
    breaks the rule (some exporters wrote them), the checker refuses it. The converted model
    says IR version 4, the first without the rule, where an initializer is not an input."""
    proto = getattr(model, "proto", model)  # a StreamedModel's proto holds its graph
    graph = proto.graph
    if proto.ir_version >= 4:
        return model
    inputs = {value.name for value in graph.input}
    stored = [tensor.name for tensor in graph.initializer]
    if any(name not in inputs for name in stored):
        proto.ir_version = 4
    return model
