"""Running ONNX models for verification: onnxruntime, or ``onnx.reference`` where the CPU
provider has no kernel (most bfloat16 ops), since that evaluator computes in the stored types."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from graphamp.core import dtypes
from graphamp.errors import GraphampError, InternalError, RunFailure
from graphamp.numerics.inputs import InputSpec
from graphamp.onnx.io import infile
from graphamp.onnx.io.files import (
    TYPE_INFERENCE_STUB,
    inferred_types,
    without_large_initializers,
)
from graphamp.onnx.numerics.emulate import LOW_CODES, emulated, has_low_values, mentions_low
from graphamp.onnx.numerics.session import QDQ_SWITCH, holds_float8, loaded, run_message

NotImplementedByOrt = ort.capi.onnxruntime_pybind11_state.NotImplemented

# onnx.reference runs bfloat16 matrix products in numpy, slowly: only for models up to this size.
REFERENCE_MAX_BYTES = 64 * 1024 * 1024


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The graph inputs a caller feeds (initializers excluded), integer ids bounded by the
    embedding table they index."""
    initializers = {init.name for init in model.graph.initializer}
    bounds = _gather_bounds(model)
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        shape = (
            tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim)
            if tensor_type.HasField("shape")
            else None  # no shape declared: any rank
        )
        dtype = dtypes.from_onnx(tensor_type.elem_type) or onnx.TensorProto.DataType.Name(
            tensor_type.elem_type
        )
        specs.append(InputSpec(value.name, dtype, shape, bounds.get(value.name)))
    return specs


# Ops between a stored table and the Gather reading it that keep its shape: a quantised model's
# DequantizeLinear (onnxruntime's quantize_static stores the embeddings as int8/uint16 there).
_SHAPE_KEEPING = ("DequantizeLinear", "Cast", "Identity")


def _gather_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """For inputs used as Gather indices into a stored table (or a stored table through a
    DequantizeLinear, Cast or Identity): the table's size on that axis, so random token ids
    stay inside the embedding."""
    shapes = {init.name: list(init.dims) for init in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output if out}
    bounds: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or len(node.input) < 2:
            continue
        table, seen = node.input[0], 0
        while table not in shapes and table in producers and seen < 4:
            producer = producers[table]
            if producer.op_type not in _SHAPE_KEEPING or producer.domain not in ("", "ai.onnx"):
                break
            table, seen = producer.input[0], seen + 1
        if table not in shapes:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        size = shapes[table][axis]
        bounds[node.input[1]] = min(size, bounds.get(node.input[1], size))
    return bounds


def run(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], provider: str = "cpu"
) -> tuple[dict[str, np.ndarray], str]:
    """Outputs of ``model`` on ``feeds`` (each converted to the input's declared type), and the
    evaluator that computed them (:func:`runner`'s, for one run)."""
    evaluate, evaluator = runner(model, provider)
    return evaluate(feeds), evaluator


Evaluate = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def emulation_types(model: onnx.ModelProto) -> tuple[dict[str, int], int]:
    """The element type of each value of ``model``'s main graph that the emulation rounds by,
    and how many node outputs still have none. onnx's inference types no output of an
    onnxruntime op (``com.microsoft``: fused attention, Skip norms, FastGelu) and so nothing
    after one, where the model carries no ``value_info`` (another tool's output): those gaps
    are filled from onnxruntime's symbolic inference, which knows its own ops (onnx's types
    win where both know one), else counted, and said beside "rounding emulated"."""
    types = inferred_types(model)
    missing = _untyped(model, types)
    if missing and (has_low_values(model, types) or mentions_low(model.graph)):
        types = {**_runtime_types(model), **types}  # (not for a float32 model: no low value)
        missing = _untyped(model, types)
    return types, len(missing)


def _untyped(model: onnx.ModelProto, types: dict[str, int]) -> list[str]:
    return [out for node in model.graph.node for out in node.output if out and out not in types]


def _weights_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its weights of over 256 elements as typed graph inputs of their shape
    and no data (nothing large copied): the symbolic inference reads an initializer's values
    wherever an op reads it (a position table added to the embeddings), which a data-less
    stub cannot give, while an input's shape and type are all it needs there."""
    light = without_large_initializers(model)
    if light is model:  # nothing large: nothing stubbed, nothing to move
        return model
    stubs = [init for init in light.graph.initializer if _is_stub(init)]
    for init in stubs:
        light.graph.initializer.remove(init)
        light.graph.input.append(
            onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
        )
    return light


def _is_stub(init: onnx.TensorProto) -> bool:
    return init.data_location == onnx.TensorProto.EXTERNAL and any(
        entry.key == "location" and entry.value == TYPE_INFERENCE_STUB
        for entry in init.external_data
    )


def _runtime_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element types from onnxruntime's symbolic shape inference, as far as it gets (it stops
    on ops and shapes it does not know). Its steps are called one by one rather than through
    ``SymbolicShapeInference.infer_shapes``, which on an incomplete inference saves the model
    into the current folder (``sym_shape_infer_temp.onnx`` and its data) and raises, dropping
    the types it found; a change of those steps in another onnxruntime costs the types, not
    the check."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    inference = SymbolicShapeInference(
        int_max=2**31 - 1, auto_merge=True, guess_output_rank=False, verbose=0
    )
    try:
        inference._preprocess(_weights_as_inputs(model))
        while inference.run_:  # (another pass where merging symbols changed a shape)
            inference._infer_impl()
    except Exception:  # an op or a shape it cannot follow: what it typed before stays
        pass
    known = getattr(inference, "known_vi_", {})
    return {
        name: info.type.tensor_type.elem_type
        for name, info in known.items()
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type
    }


def runner(model: onnx.ModelProto, provider: str = "cpu") -> tuple[Evaluate, str]:
    """A function giving ``model``'s outputs on feeds (each converted to the input's declared
    type), loaded once for any number of runs, and the evaluator that computes them.

    On the CPU a model holding float16/bfloat16 values runs as its faithful float32 emulation
    (:mod:`graphamp.onnx.numerics.emulate`): the CPU provider would compute float16 in float32
    between casts and hide rounding and overflow. A QDQ model runs op by op there (no graph
    optimisation): the provider's fused integer kernels are not the model's arithmetic.
    ``onnx.reference`` (which computes in the stored types) is the fallback for a model
    onnxruntime cannot run, if it is small enough.
    """
    emulation = ""
    as_written: onnx.ModelProto | None = None
    if provider == "cpu":
        types, untyped = emulation_types(model)
        if has_low_values(model, types):
            as_written = model
            names = sorted({LOW_CODES[c] for c in types.values() if c in LOW_CODES})
            emulation = f", {'/'.join(names)} rounding emulated"
            if untyped:
                emulation += f" ({untyped} values of unknown type not rounded)"
            model = emulated(model, types)
    quantised = provider == "cpu" and _has_quantisers(model)
    if quantised:
        emulation += ", quantisers op by op"
    # use_tf32=0: by default the CUDA provider runs float32 MatMul, Gemm and Conv on TF32
    # tensor cores, which round their inputs to float16's 10-bit mantissa, so a node kept
    # float32 for its precision would not be (tools/gpu/gpu_numerics.py measures it).
    cuda = ("CUDAExecutionProvider", {"use_tf32": "0"})
    providers = [cuda, "CPUExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
    options = ort.SessionOptions()
    # (a run that fails is raised as one line below, not also logged in onnxruntime's form)
    options.log_severity_level = 4
    if holds_float8(model):  # (CUDA too: its QDQ fusion refuses float8 MatMuls without bias)
        options.add_session_config_entry(QDQ_SWITCH, "1")
    if quantised:
        # The CPU provider fuses a float32 DequantizeLinear -> op -> QuantizeLinear group into
        # an integer kernel that requantises its own way: on a quantised ViT that alone moves
        # the output by up to 17 quantisation steps from the model's op-by-op value (what
        # onnx.reference computes), while an emulated low-precision model, its groups broken by
        # rounding Casts, runs mostly unfused. Both sides of a comparison run op by op.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # Provider set-up failures (a CUDA provider without CUDA libraries) are reported by
    # graphamp in one line below, not in onnxruntime's multi-line log.
    ort.set_default_logger_severity(4)
    try:
        session = loaded(model.SerializeToString(), options, providers=providers)
    except NotImplementedByOrt as exc:
        if model.ByteSize() > REFERENCE_MAX_BYTES:
            raise GraphampError(
                f"onnxruntime ({provider}) cannot run the converted model ({_first_line(exc)}), "
                "and it is too large for onnx.reference: verify with --provider cuda"
            ) from None
        from onnx.reference import ReferenceEvaluator

        reference = ReferenceEvaluator(model)
        names = [o.name for o in model.graph.output]

        def evaluate_reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            typed = _typed_feeds(model, feeds)
            return dict(zip(names, reference.run(names, typed), strict=True))

        return evaluate_reference, "onnx.reference"
    except Exception as exc:  # onnxruntime's own error types: the model cannot be verified
        raise GraphampError(
            f"onnxruntime cannot load the model to verify it: {_first_line(exc)}"
        ) from None
    names = [o.name for o in session.get_outputs()]
    used = _used(session)
    if provider == "cuda" and used != "cuda":
        raise GraphampError(_no_cuda(f"no GPU, or no CUDA libraries; it would run on {used}"))

    unchecked = [as_written] if as_written is not None else []

    def evaluate(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        typed = _typed_feeds(model, feeds)
        try:
            outputs = session.run(names, typed)
        except Exception as exc:  # onnxruntime's own error types: the inputs do not suit it
            raise RunFailure(f"onnxruntime: {run_message(exc)}") from None
        if unchecked:  # once: the kernels of the model as written, on the first feeds
            _run_as_written(unchecked.pop(), feeds)
        return dict(zip(names, outputs, strict=True))

    tf32 = ", use_tf32=0" if used == "cuda" else ""
    return evaluate, f"onnxruntime {used}{emulation}{tf32}"


def _run_as_written(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """Run ``model`` once as it is written, on the CPU provider: its emulation (what the
    verification compares) runs every op in float32, so a node whose kernel refuses its
    low-precision types at run time, which no checker and no load sees (a float16 value
    beside a float32 scale), would pass unseen. RunFailure where it fails; nothing where the
    provider has no kernel for part of it (the runtime check says so) or the model is over
    the runtime check's size."""
    if model.ByteSize() > RUNTIME_CHECK_MAX_BYTES or not _numpy_io(model):
        return
    options = ort.SessionOptions()
    options.log_severity_level = 4
    if holds_float8(model):
        options.add_session_config_entry(QDQ_SWITCH, "1")
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    except Exception:  # a kernel missing on the CPU, or what the emulation's session met
        return
    try:
        session.run(None, _typed_feeds(model, feeds))
    except Exception as exc:  # onnxruntime's own error types
        raise RunFailure(
            f"onnxruntime loads the model as written but fails to run it: {run_message(exc)}"
        ) from None


# Element types onnxruntime's Python API takes and gives as numpy arrays (not bfloat16 or the
# 8-bit floats: their numpy types, ml_dtypes', are not ones it converts).
_NUMPY_IO = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.BOOL,
        onnx.TensorProto.INT8,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT64,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.UINT32,
        onnx.TensorProto.UINT64,
    }
)


def _numpy_io(model: onnx.ModelProto) -> bool:
    """Whether every graph input and output of ``model`` is a tensor of a type onnxruntime's
    Python API exchanges as a numpy array (a bfloat16 input is not)."""
    values = [*model.graph.input, *model.graph.output]
    return all(
        v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in _NUMPY_IO for v in values
    )


def check_provider(provider: str) -> None:
    """Refuse ``--provider cuda`` where onnxruntime cannot use CUDA (no GPU, no CUDA libraries
    or a CPU-only build), before any work: a one-node model is loaded the way :func:`run`
    loads one, and the provider onnxruntime picked for it is read back."""
    if provider != "cuda":
        return
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise GraphampError(_no_cuda("this onnxruntime build has no CUDA provider"))
    helper, float32 = onnx.helper, onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", float32, [1])],
        [helper.make_tensor_value_info("y", float32, [1])],
    )
    ort.set_default_logger_severity(4)  # a failed CUDA set-up is our one line, not ort's log
    try:
        session = ort.InferenceSession(
            helper.make_model(
                graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7
            ).SerializeToString(),
            providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
        )
    except Exception as exc:  # onnxruntime's own error types
        raise GraphampError(_no_cuda(_first_line(exc))) from None
    if _used(session) != "cuda":
        raise GraphampError(
            _no_cuda(f"no GPU, or no CUDA libraries; it would run on {_used(session)}")
        )


def _used(session: ort.InferenceSession) -> str:
    """The provider a session runs on first: "cuda", "cpu"."""
    return session.get_providers()[0].replace("ExecutionProvider", "").lower()


def _no_cuda(why: str) -> str:
    return (
        f"--provider cuda: onnxruntime could not use CUDA here ({why}): verify with --provider cpu"
    )


RUNTIME_CHECK_MAX_BYTES = 512 * 1024 * 1024


def check_loads(original: Path, converted: Path) -> list[str]:
    """The converted model must load wherever the original does (CPU provider; models over
    512 MiB are not checked, to keep conversion at disk speed). A missing kernel for the low
    type is a warning, since the model is valid and runs on a provider that has one.

    The original is loaded only when the converted model is refused (to tell a model the
    runtime refuses anyway from one graphamp broke), and each load is the cheapest that still
    has onnxruntime resolve and type-check the whole graph and find a kernel for every node:
    see :func:`_load_error`."""
    size = sum(p.stat().st_size for p in converted.parent.glob(f"{converted.name}*"))
    if size > RUNTIME_CHECK_MAX_BYTES:
        return []
    error = _load_error(converted)
    if error is None:
        return _default_session_note(converted)
    if _load_error(original) is not None:
        return []
    if isinstance(error, NotImplementedByOrt):
        return [
            "onnxruntime's CPU provider has no kernel for part of the converted model "
            f"({_first_line(error)}): it runs on a provider that has one (CUDA)"
        ]
    raise InternalError(f"onnxruntime refuses the converted model: {_first_line(error)}")


def _default_session_note(path: Path) -> list[str]:
    """For a float8 model: one line when onnxruntime's default session refuses it (its QDQ
    fusion makes MatMulIntegerToFloat of a float8 MatMul whose float32 output no bias Add
    follows, which that op's schema refuses), saying how to load it, which is found by
    loading it so (QDQ fusion off, or where that is not enough all optimisations off); else
    nothing."""
    mapped = infile.read(path)
    proto = mapped.proto if mapped is not None else onnx.load(str(path), load_external_data=False)
    if not holds_float8(proto):
        return []
    error = _load_error(path, optimised=True)
    if error is None:
        return []
    refused = f"onnxruntime's default session refuses this float8 model ({_first_line(error)})"
    if _load_error(path, optimised=True, qdq_fusion=False) is None:
        return [
            f"{refused}: load it with the session option {QDQ_SWITCH}=1 (SessionOptions()."
            f"add_session_config_entry('{QDQ_SWITCH}', '1')), as graphamp's checks do"
        ]
    # another of its graph optimisations fails on it (MatMulAddFusion on a graph its own
    # optimizer already fused): only a session without them loads it
    return [
        f"{refused}, also with {QDQ_SWITCH}=1: load it with graph optimisations off "
        "(SessionOptions().graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL),"
        " as graphamp's checks do, or keep the products involved out of float8"
        " (--fp8-deny-names)"
    ]


def _load_error(
    path: Path, *, optimised: bool = False, qdq_fusion: bool = True
) -> BaseException | None:
    """Why onnxruntime's CPU provider refuses the model at ``path`` (None when it loads it);
    ``optimised``: with the default graph optimisations, ``qdq_fusion`` off: without their
    QDQ fusion.

    A session built only to be thrown away: no graph optimisations and no pre-packing (which
    copy and rewrite weights a check never runs), one thread. The graph onnxruntime loads is
    the file's, but for the weights the file holds: those are referenced as external data of
    the file itself (its own bytes, where :mod:`graphamp.onnx.io.infile` finds them), which
    onnxruntime memory-maps and never reads here, so the load costs the graph, not the
    weights (reading them in would cost time and memory in proportion to the model)."""
    options = ort.SessionOptions()
    options.log_severity_level = 4
    if not optimised:  # (optimised: the default level, whose QDQ fusion a float8 model meets)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.add_session_config_entry("session.disable_prepacking", "1")
    if not qdq_fusion:
        options.add_session_config_entry(QDQ_SWITCH, "1")
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    ort.set_default_logger_severity(4)
    with _weights_by_reference(path) as model:
        try:
            ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's own error types, one per status
            return exc
    return None


@contextmanager
def _weights_by_reference(path: Path) -> Iterator[Path]:
    """A model file beside ``path`` (removed after the block) whose large in-file weights are
    external data pointing into ``path``; ``path`` itself where it holds none or the folder
    takes no file."""
    mapped = infile.read(path)
    if mapped is None or not mapped.tensors:
        yield path
        return
    for init in mapped.proto.graph.initializer:
        tensor = mapped.tensors.get(init.name)
        if tensor is not None:
            init.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (
                ("location", path.name),
                ("offset", tensor.offset),
                ("length", tensor.nbytes),
            ):
                init.external_data.add(key=key, value=str(value))
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".onnx", dir=path.parent)
    except OSError:
        yield path
        return
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(mapped.proto.SerializeToString())
        yield Path(name)
    finally:
        os.unlink(name)


def _typed_feeds(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each feed in its input's declared type."""
    typed: dict[str, np.ndarray] = {}
    initializers = {init.name for init in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        if value.name not in feeds:
            raise GraphampError(f"no value given for model input {value.name!r}")
        name = dtypes.from_onnx(value.type.tensor_type.elem_type)
        target = dtypes.numpy_type(name) if name else feeds[value.name].dtype
        typed[value.name] = feeds[value.name].astype(target)
    return typed


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:200]


def _has_quantisers(model: onnx.ModelProto) -> bool:
    """Whether ``model``'s main graph holds a QuantizeLinear or DequantizeLinear (a QDQ model)."""
    return any(
        node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.domain in ("", "ai.onnx")
        for node in model.graph.node
    )
