"""onnxruntime sessions for the numerics tools: CPU provider, quiet, any model size.

Large initializers are not serialized: onnxruntime gets them as arrays (external
initializers, used where they are, not copied), and the model it parses holds data-less stubs.
That saves serializing and parsing the weights again for every session (the bulk of a large
model's bytes), and sessions over models that hold the same weights share one copy
(:class:`Weights`).
A model still over protobuf's 2 GB limit without them is written to a temporary folder with
external data and loaded from there.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from graphamp.core import dtypes
from graphamp.errors import GraphampError, RunFailure
from graphamp.onnx.io.files import with_stubs

_NoKernel = ort.capi.onnxruntime_pybind11_state.NotImplemented

SERIALIZE_LIMIT = 1_900_000_000
_INLINE_ELEMENTS = 256  # initializers up to this size stay in the model onnxruntime parses
_T = onnx.TensorProto
# Element types given as arrays: those numpy holds natively (no ml_dtypes types).
_ARRAY_TYPES = frozenset(
    {_T.FLOAT, _T.FLOAT16, _T.DOUBLE, _T.INT8, _T.INT16, _T.INT32, _T.INT64, _T.UINT8, _T.BOOL}
)
_STUB_LOCATION = "graphamp-session-weight"  # never read: the value is given as an array


FLOAT8_CODES = frozenset({17, 18, 19, 20})  # onnx.TensorProto's FLOAT8* element types
QDQ_SWITCH = "session.disable_quant_qdq"


def holds_float8(model: onnx.ModelProto) -> bool:
    """Whether ``model`` stores float8 values (weights or zero points: a float8 QDQ model)."""
    return any(init.data_type in FLOAT8_CODES for init in model.graph.initializer)


class Weights:
    """Large initializers as onnxruntime values, each converted once. One store may serve the
    sessions of several models only when an initializer name means the same values in all of
    them (the switchable model and its comparison model hold the float32 model's weights).

    A model built for sessions may hold *stubs* instead of its large initializers (data-less,
    :meth:`stub`): their values are in the store, and only a session given the store runs it."""

    def __init__(self) -> None:
        self._values: dict[str, tuple[np.ndarray, ort.OrtValue]] = {}

    def value(self, init: onnx.TensorProto) -> ort.OrtValue:
        known = self._values.get(init.name)
        if is_stub(init):
            if known is None:
                raise GraphampError(f"internal error: no value for the weight {init.name!r}")
            return known[1]
        dtype = helper.tensor_dtype_to_np_dtype(init.data_type)
        if known is not None and known[0].shape == tuple(init.dims) and known[0].dtype == dtype:
            return known[1]
        return self._add(init.name, numpy_helper.to_array(init))

    def array(self, init: onnx.TensorProto) -> np.ndarray:
        """The value of ``init`` (a stub's, from the store)."""
        self.value(init)
        return self._values[init.name][0]

    def stub(self, name: str, array: np.ndarray) -> onnx.TensorProto:
        """A stub initializer ``name`` whose value, ``array``, the store holds."""
        self._add(name, array)
        stub = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
        stub.dims.extend(array.shape)
        stub.data_location = _T.EXTERNAL
        stub.external_data.add(key="location", value=_STUB_LOCATION)
        return stub

    def stubbed(self, proto: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of ``proto`` whose large initializers are stubs of values put in the store:
        the weights are converted once, and the copy costs none of their bytes."""
        light, names = _without_weights(proto)
        for init in proto.graph.initializer:
            if init.name in names:
                self.value(init)
        return light

    def _add(self, name: str, array: np.ndarray) -> ort.OrtValue:
        array = np.ascontiguousarray(array)
        self._values[name] = (array, ort.OrtValue.ortvalue_from_numpy(array))
        return self._values[name][1]


class Session:
    """One onnxruntime CPU session over ``proto``; ``run`` casts feeds to the declared types."""

    def __init__(
        self,
        proto: onnx.ModelProto,
        *,
        what: str = "the model",
        level: ort.GraphOptimizationLevel | None = None,
        weights: Weights | None = None,
        fold: bool = True,
    ) -> None:
        self.what = what
        self.input_types = _input_types(proto)
        options = ort.SessionOptions()
        # (a run that fails is raised as one line, not also logged in onnxruntime's form)
        options.log_severity_level = 4
        # Memory patterns pre-plan one block for every intermediate of a run, and the arena
        # keeps what a run took: with the statistics models (thousands of small reductions)
        # together they hold a block per intermediate on top of the model, at no gain in
        # speed.
        options.enable_mem_pattern = False
        options.enable_cpu_mem_arena = False
        # A thread that waits for work sleeps instead of spinning: a model of thousands of
        # small nodes (statistics, Ifs) otherwise keeps a second core busy waiting, CPU time
        # that other work on shared cores needs. The values computed are the same.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if level is not None:
            options.graph_optimization_level = level
        if holds_float8(proto):
            # onnxruntime's QDQ fusion refuses a float8 MatMul without a bias Add after it;
            # unfused, its DequantizeLinear + MatMul compute the model's float8 arithmetic
            options.add_session_config_entry(QDQ_SWITCH, "1")
        ort.set_default_logger_severity(4)
        self.weights = weights if weights is not None else Weights()
        light, names = _without_weights(proto)
        values = [
            self.weights.value(init) for init in proto.graph.initializer if init.name in names
        ]
        if names:
            options.add_external_initializers(list(names), values)
        # fold=False: no constant folding, which in a switchable model only copies weights
        # (its Ifs' branches read them); the values computed are the same either way.
        kwargs = {"providers": ["CPUExecutionProvider"]}
        if not fold:
            kwargs["disabled_optimizers"] = ["ConstantFolding"]
        try:
            if light.ByteSize() < SERIALIZE_LIMIT:
                self._session = loaded(light.SerializeToString(), options, **kwargs)
            else:
                with tempfile.TemporaryDirectory(prefix="graphamp-") as folder:
                    path = Path(folder) / "model.onnx"
                    onnx.save(light, str(path), save_as_external_data=True, location="model.data")
                    self._session = loaded(str(path), options, **kwargs)
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
            raise RunFailure(f"onnxruntime cannot run {self.what}: {run_message(exc)}") from None
        return dict(zip(names, values, strict=True))


def loaded(model: bytes | str, options: ort.SessionOptions, **kwargs: Any) -> ort.InferenceSession:
    """An onnxruntime session of ``model``; where one of onnxruntime's graph optimisations
    fails on a model it loads unoptimised (1.31 refuses the BERT its own transformer optimizer
    writes: "Attempt to replace the existing tensor"), the unoptimised session: op by op, the
    model's own arithmetic. A missing kernel, or a model refused either way, raises the
    first error."""
    unoptimised = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        return ort.InferenceSession(model, options, **kwargs)
    except _NoKernel:
        raise
    except Exception as exc:  # onnxruntime's own error types
        if options.graph_optimization_level == unoptimised:
            raise
        first = exc
    options.graph_optimization_level = unoptimised
    try:
        return ort.InferenceSession(model, options, **kwargs)
    except Exception:  # onnxruntime's own error types: the first one says more
        raise first from None


def _without_weights(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, None]]:
    """A copy of ``proto`` whose large initializers (main graph) are data-less stubs, and their
    names, in order. Nothing big is copied."""
    names = {
        init.name: None
        for init in proto.graph.initializer
        if is_stub(init)
        or (
            init.data_type in _ARRAY_TYPES
            and init.data_location != _T.EXTERNAL
            and int(np.prod(init.dims)) > _INLINE_ELEMENTS
        )
    }
    if not names:
        return proto, names
    fresh = {
        init.name for init in proto.graph.initializer if init.name in names and not is_stub(init)
    }
    return with_stubs(proto, fresh, _STUB_LOCATION), names


def is_stub(init: onnx.TensorProto) -> bool:
    """Whether ``init`` is a :class:`Weights` stub (its value is in a store)."""
    return init.data_location == _T.EXTERNAL and any(
        entry.key == "location" and entry.value == _STUB_LOCATION for entry in init.external_data
    )


def _input_types(proto: onnx.ModelProto) -> dict[str, int]:
    stored = {init.name for init in proto.graph.initializer}
    return {v.name: v.type.tensor_type.elem_type for v in proto.graph.input if v.name not in stored}


def run_message(exc: BaseException) -> str:
    """What onnxruntime says of a failed run in one short line: the node, and its reason
    without the error-code prefix, the source location and the C++ check that failed."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", lines[0])
    node = re.search(r"running (\w+) node\. Name:'([^']*)'", text)
    detail = text.split("Status Message: ", 1)[-1]
    detail = re.sub(r"^\S+:\d+ ", "", detail)  # the source file of the check
    if " was false. " in detail:  # the C++ check itself: its explanation follows it
        detail = detail.split(" was false. ", 1)[1]
    where = f"{node[1]} node {node[2]!r}: " if node else ""
    return (where + detail)[:300]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def as_proto(model: object, what: str = "model") -> onnx.ModelProto:
    """A ``ModelProto`` of a path (external data loaded), a ``ModelProto`` (as it is) or an
    ``onnx_ir`` model."""
    import onnx_ir as ir

    from graphamp.onnx.io.infile import StreamedModel

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, StreamedModel):
        return model.to_proto()
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
