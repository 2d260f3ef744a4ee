"""Numerical verification: run the float32 and the converted model on the same inputs.

Inputs are random (never zeros: zeros hide unwritten outputs and wrong wiring) unless the user
gives an ``.npz``. Float inputs are drawn from a standard normal, integer inputs (token ids,
positions) from ``[1, int_high)``, booleans at random; a symbolic dimension takes
``dim_size``. Both models run on onnxruntime; the report gives, per output, the max absolute
error, the max relative error (relative to max |y| of the float32 output) and NaN/Inf counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort

from graphamp.errors import GraphampError

NotImplementedByOrt = ort.capi.onnxruntime_pybind11_state.NotImplemented

# Default tolerance on max |y - y32| / max |y32| per output, by target dtype.
DEFAULT_RTOL = {"float16": 1e-2, "bfloat16": 5e-2}

_NP = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.BFLOAT16: ml_dtypes.bfloat16,
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.BOOL: np.bool_,
}


@dataclass
class OutputReport:
    name: str
    max_abs_error: float
    max_rel_error: float  # max |y - y32| / max |y32|
    nan_inf: int  # NaN/Inf in the converted output that the float32 output does not have
    reference_nan_inf: int


@dataclass
class Report:
    outputs: list[OutputReport]
    rtol: float
    atol: float
    provider: str

    def passed(self, output: OutputReport) -> bool:
        """No new NaN/Inf, and within rtol (relative to max |y32|) or within atol."""
        return output.nan_inf == 0 and (
            output.max_rel_error <= self.rtol or output.max_abs_error <= self.atol
        )

    @property
    def ok(self) -> bool:
        return all(self.passed(output) for output in self.outputs)


def random_inputs(
    model: onnx.ModelProto, *, seed: int = 0, dim_size: int = 2, int_high: int = 16
) -> dict[str, np.ndarray]:
    """One random array per graph input of ``model`` (initializers excluded)."""
    rng = np.random.default_rng(seed)
    initializers = {init.name for init in model.graph.initializer}
    index_bounds = _gather_bounds(model)
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        shape = [
            d.dim_value if d.HasField("dim_value") else dim_size for d in tensor_type.shape.dim
        ]
        elem = tensor_type.elem_type
        if elem in (
            onnx.TensorProto.FLOAT,
            onnx.TensorProto.FLOAT16,
            onnx.TensorProto.DOUBLE,
            onnx.TensorProto.BFLOAT16,
        ):
            array = rng.standard_normal(shape).astype(np.float32)
            array[array == 0] = 0.5  # never zero
        elif elem in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            high = index_bounds.get(value.name, int_high)
            array = rng.integers(min(1, high - 1), high, size=shape).astype(_NP[elem])
        elif elem == onnx.TensorProto.BOOL:
            array = rng.random(shape) < 0.5
        else:
            raise GraphampError(
                f"input {value.name!r}: cannot make random values of type "
                f"{onnx.TensorProto.DataType.Name(elem)}; pass --inputs FILE.npz"
            )
        feeds[value.name] = array
    return feeds


def _gather_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """For inputs used as Gather indices into a stored table: the table's size on that axis,
    so random token ids stay inside the embedding."""
    shapes = {init.name: list(init.dims) for init in model.graph.initializer}
    bounds: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[0] not in shapes:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        size = shapes[node.input[0]][axis]
        bounds[node.input[1]] = min(size, bounds.get(node.input[1], size))
    return bounds


def load_inputs(path: str | Path) -> dict[str, np.ndarray]:
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise GraphampError(f"{path}: inputs file not found") from None
    except (ValueError, OSError) as exc:
        raise GraphampError(f"{path}: not an .npz file of arrays ({exc})") from None


# onnx.reference runs bfloat16 matrix products in numpy, slowly: only for models up to this size.
REFERENCE_MAX_BYTES = 64 * 1024 * 1024


def run(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], provider: str = "cpu"
) -> tuple[dict[str, np.ndarray], str]:
    """Outputs of ``model`` on ``feeds`` (each converted to the input's declared type), and the
    backend that computed them.

    onnxruntime's CPU provider has no bfloat16 kernel for most ops; for a model it cannot run,
    ``onnx.reference`` computes in the stored types instead, if the model is small enough.
    """
    typed: dict[str, np.ndarray] = {}
    initializers = {init.name for init in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        if value.name not in feeds:
            raise GraphampError(f"no value given for model input {value.name!r}")
        elem = value.type.tensor_type.elem_type
        typed[value.name] = feeds[value.name].astype(_NP.get(elem, feeds[value.name].dtype))
    providers = (
        ["CUDAExecutionProvider", "CPUExecutionProvider"]
        if provider == "cuda"
        else ["CPUExecutionProvider"]
    )
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=providers)
    except NotImplementedByOrt as exc:
        if model.ByteSize() > REFERENCE_MAX_BYTES:
            raise GraphampError(
                f"onnxruntime ({provider}) cannot run the converted model ({_first_line(exc)}), "
                "and it is too large for onnx.reference: verify with --provider cuda"
            ) from None
        from onnx.reference import ReferenceEvaluator

        evaluator = ReferenceEvaluator(model)
        names = [o.name for o in model.graph.output]
        return dict(zip(names, evaluator.run(names, typed), strict=True)), "onnx.reference"
    names = [o.name for o in session.get_outputs()]
    used = session.get_providers()[0].replace("ExecutionProvider", "").lower()
    return dict(zip(names, session.run(names, typed), strict=True)), f"onnxruntime {used}"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:200]


def compare(
    reference: dict[str, np.ndarray],
    converted: dict[str, np.ndarray],
    *,
    rtol: float,
    atol: float,
    provider: str,
) -> Report:
    reports = []
    for name, expected in reference.items():
        expected64 = np.asarray(expected).astype(np.float64)
        actual64 = np.asarray(converted[name]).astype(np.float64)
        finite = np.isfinite(expected64)
        scale = float(np.max(np.abs(expected64[finite]))) if finite.any() else 0.0
        diff = np.abs(actual64 - expected64)[finite & np.isfinite(actual64)]
        max_abs = float(diff.max()) if diff.size else 0.0
        reports.append(
            OutputReport(
                name=name,
                max_abs_error=max_abs,
                max_rel_error=max_abs / scale if scale else max_abs,
                nan_inf=int(np.count_nonzero(~np.isfinite(actual64) & finite)),
                reference_nan_inf=int(np.count_nonzero(~finite)),
            )
        )
    return Report(reports, rtol, atol, provider)


def verify(
    original: onnx.ModelProto,
    converted: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    *,
    rtol: float,
    atol: float = 0.0,
    provider: str = "cpu",
) -> Report:
    """Run both models on ``feeds`` and compare every output."""
    reference, reference_backend = run(original, feeds, provider)
    outputs, backend = run(converted, feeds, provider)
    label = (
        backend if backend == reference_backend else f"{backend} vs float32 on {reference_backend}"
    )
    return compare(reference, outputs, rtol=rtol, atol=atol, provider=label)
