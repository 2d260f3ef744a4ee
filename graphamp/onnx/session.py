"""onnxruntime sessions for the numerics tools: CPU provider, quiet, any model size.

A model over protobuf's 2 GB limit (two copies of a large model, say) is written to a
temporary folder with external data and loaded from there.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from graphamp import dtypes
from graphamp.errors import GraphampError

SERIALIZE_LIMIT = 1_900_000_000


class Session:
    """One onnxruntime CPU session over ``proto``; ``run`` casts feeds to the declared types."""

    def __init__(
        self,
        proto: onnx.ModelProto,
        *,
        what: str = "the model",
        level: ort.GraphOptimizationLevel | None = None,
    ) -> None:
        self.what = what
        self.input_types = _input_types(proto)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # Memory patterns pre-plan one block for every intermediate of a run, and the arena
        # keeps what a run took: with the statistics models (thousands of small reductions)
        # together they held several times the model's memory (5 GB on BERT-base, batch 8,
        # against 1 GB without them), at no gain in speed.
        options.enable_mem_pattern = False
        options.enable_cpu_mem_arena = False
        if level is not None:
            options.graph_optimization_level = level
        ort.set_default_logger_severity(4)
        try:
            if proto.ByteSize() < SERIALIZE_LIMIT:
                self._session = ort.InferenceSession(
                    proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
                )
            else:
                with tempfile.TemporaryDirectory(prefix="graphamp-") as folder:
                    path = Path(folder) / "model.onnx"
                    onnx.save(proto, str(path), save_as_external_data=True, location="model.data")
                    self._session = ort.InferenceSession(
                        str(path), options, providers=["CPUExecutionProvider"]
                    )
        except Exception as exc:  # onnxruntime's own error types
            raise GraphampError(f"onnxruntime cannot load {what}: {_first_line(exc)}") from None
        self.outputs = [o.name for o in self._session.get_outputs()]

    def run(
        self, feeds: dict[str, np.ndarray], outputs: Iterable[str] | None = None
    ) -> dict[str, np.ndarray]:
        names = list(outputs) if outputs is not None else self.outputs
        typed = {}
        for name, code in self.input_types.items():
            if name not in feeds:
                raise GraphampError(f"no value given for model input {name!r}")
            dtype = dtypes.from_onnx(code)
            typed[name] = np.asarray(feeds[name]).astype(
                dtypes.numpy_type(dtype) if dtype else feeds[name].dtype, copy=False
            )
        try:
            values = self._session.run(names, typed)
        except Exception as exc:  # onnxruntime's own error types
            raise GraphampError(f"onnxruntime cannot run {self.what}: {_first_line(exc)}") from None
        return dict(zip(names, values, strict=True))


def _input_types(proto: onnx.ModelProto) -> dict[str, int]:
    stored = {init.name for init in proto.graph.initializer}
    return {v.name: v.type.tensor_type.elem_type for v in proto.graph.input if v.name not in stored}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def as_proto(model: object, what: str = "model") -> onnx.ModelProto:
    """A ``ModelProto`` of a path (external data loaded), a ``ModelProto`` (as it is) or an
    ``onnx_ir`` model."""
    import onnx_ir as ir

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, ir.Model):
        return ir.to_proto(model)
    if isinstance(model, str | Path):
        if not Path(model).is_file():
            raise GraphampError(f"{model}: no such file")
        try:
            return onnx.load(str(model), load_external_data=True)
        except Exception as exc:  # protobuf and file errors alike
            raise GraphampError(f"{model}: not an ONNX model ({_first_line(exc)})") from None
    raise GraphampError(f"{what}: expected a path or an ONNX model, got {type(model).__name__}")
