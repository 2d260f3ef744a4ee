"""ONNX files in and out: load with type inference, save atomically with external data.

Type inference runs on a copy whose large initializers are data-less stubs, so a model of
hundreds of megabytes costs no copies of its weights.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from graphamp import progress
from graphamp.errors import GraphampError
from graphamp.io import write_atomic
from graphamp.onnx import proto_reader, stream
from graphamp.onnx.datafile import DataFileWriter
from graphamp.onnx.proto_reader import ProtoModel
from graphamp.onnx.validate import validate

log = logging.getLogger(__name__)

EXTERNAL_DATA_THRESHOLD = 1_900_000_000  # bytes of weights above which we write external data
EXTERNAL_DATA_KEY = "graphamp.external_data"


def load(path: str | os.PathLike[str], *, direct: bool = False) -> ir.Model | ProtoModel:
    """Read an ONNX file (with its external data) and run type inference on it; with
    ``direct``, a :class:`ProtoModel` where the file suits the direct path."""
    path = Path(path)
    if not path.is_file():
        raise GraphampError(f"{path}: no such file")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises several unrelated types for bad bytes
        raise GraphampError(f"{path}: not an ONNX model ({type(exc).__name__}: {exc})") from None
    return _validated(proto, str(path), path.parent, direct=direct)


def from_proto(
    proto: onnx.ModelProto, *, where: str = "model", base_dir: Path | None = None
) -> ir.Model:
    """An onnx_ir model from ``proto`` (not modified), with inferred value types."""
    model = _validated(proto, where, base_dir, direct=False)
    assert isinstance(model, ir.Model)
    return model


def direct(
    proto: onnx.ModelProto, *, where: str = "model", base_dir: Path | None = None
) -> ir.Model | ProtoModel:
    """A :class:`ProtoModel` of ``proto`` when it suits the direct path (nothing of onnx_ir
    is built), else :func:`from_proto`'s onnx_ir model."""
    return _validated(proto, where, base_dir, direct=True)


def _validated(
    proto: onnx.ModelProto, where: str, base_dir: Path | None, *, direct: bool
) -> ir.Model | ProtoModel:
    if not isinstance(proto, onnx.ModelProto) or not proto.HasField("graph"):
        raise GraphampError(f"{where}: not an ONNX model (no graph)")
    if not proto.graph.node:
        raise GraphampError(f"{where}: the graph has no nodes")
    checked = validate(proto, where=where, base_dir=base_dir)
    if direct and proto_reader.suits(proto, subgraphs=checked.subgraphs):
        return ProtoModel(proto, _value_info(proto, where), nodes=checked.nodes)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as exc:
        raise GraphampError(f"{where}: malformed ONNX model ({exc})") from None
    _apply_inferred_types(model, proto, where)
    if base_dir is not None:
        ir.external_data.set_base_dir(model.graph, base_dir)
    # Remembered for save(): a model whose weights lived outside keeps them outside.
    model.meta[EXTERNAL_DATA_KEY] = _has_external(model)
    return model


def _inferred(proto: onnx.ModelProto, where: str) -> onnx.ModelProto | None:
    """``proto`` after ONNX type inference (weights left out), or None where it fails."""
    light = _without_large_initializers(proto)
    try:
        return onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
    except Exception as exc:  # inference gives up on some contrib ops: fall back to local rules
        log.warning("%s: ONNX type inference failed (%s); using local type rules", where, exc)
        return None


def _apply_inferred_types(model: ir.Model, proto: onnx.ModelProto, where: str) -> None:
    """Type every value that ONNX type inference can type (see the module docstring)."""
    inferred = _inferred(proto, where)
    if inferred is None:
        return
    values = {v.name: v for v in model.graph.inputs}
    for node in model.graph:
        for value in node.outputs:
            values[value.name] = value
    # Values share few distinct types (a chain of 50,000 nodes may have one): each distinct
    # TypeProto is deserialised once. Every value gets its own type (a retype changes it in
    # place) and shares a frozen shape (nothing changes a shape; onnx_ir refuses if tried).
    known: dict[bytes, tuple[ir.TypeProtocol, ir.Shape | None]] = {}
    for info in [*inferred.graph.value_info, *inferred.graph.output]:
        value = values.get(info.name)
        if value is None or (value.type is not None and value.shape is not None):
            continue
        if not info.type.HasField("tensor_type"):
            continue
        key = info.type.SerializeToString(deterministic=True)
        if key not in known:
            shape = None
            if info.type.tensor_type.HasField("shape"):
                shape = ir.serde.deserialize_type_proto_for_shape(info.type)
                shape.freeze()  # type: ignore[union-attr]
            known[key] = (ir.serde.deserialize_type_proto_for_type(info.type), shape)
        type_, shape = known[key]
        if value.type is None:
            value.type = ir.TensorType(type_.dtype, denotation=type_.denotation)
        if value.shape is None and shape is not None:
            value.shape = shape


def _value_info(proto: onnx.ModelProto, where: str) -> dict[str, onnx.ValueInfoProto]:
    """Every value's ValueInfoProto: the model's own where it gives a type and shape, else
    type inference's (as :func:`_apply_inferred_types` fills an onnx_ir model)."""
    graph = proto.graph
    own = {info.name: info for info in [*graph.input, *graph.value_info, *graph.output]}
    inferred = _inferred(proto, where)
    if inferred is None:
        return own
    found = {info.name: info for info in inferred.graph.value_info}
    found.update((info.name, info) for info in inferred.graph.output)
    for name, info in own.items():
        tensor_type = info.type.tensor_type
        if name not in found or (tensor_type.elem_type and tensor_type.HasField("shape")):
            found[name] = info
    return found


def inferred_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> ONNX element type for every typed value of ``proto``'s main graph
    (graph I/O, initializers, and what type inference finds), without copying weights."""
    inferred = onnx.shape_inference.infer_shapes(_without_large_initializers(proto))
    types = {init.name: init.data_type for init in proto.graph.initializer}
    for info in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        if info.type.HasField("tensor_type"):
            types[info.name] = info.type.tensor_type.elem_type
    return types


def _without_large_initializers(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` whose initializers of over 256 elements are data-less external
    stubs (small ones stay: shape computations read their values). Nothing big is copied."""
    large = {init.name for init in proto.graph.initializer if _elements(init) > 256}
    if not large:
        return proto
    return with_stubs(proto, large, "graphamp-type-inference-stub")


def with_stubs(proto: onnx.ModelProto, names: set[str], location: str) -> onnx.ModelProto:
    """A copy of ``proto`` whose main-graph initializers named in ``names`` are data-less
    external stubs (dims and type kept, ``location`` as their file); the others are copied as
    they are. Nothing but those initializers' data is left out."""
    light = onnx.ModelProto()
    for descriptor, value in proto.ListFields():
        if descriptor.name != "graph":
            _copy_field(light, descriptor, value)
    for descriptor, value in proto.graph.ListFields():
        if descriptor.name != "initializer":
            _copy_field(light.graph, descriptor, value)
    for init in proto.graph.initializer:
        if init.name not in names:
            light.graph.initializer.append(init)
            continue
        stub = light.graph.initializer.add(name=init.name, data_type=init.data_type)
        stub.dims.extend(init.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        stub.external_data.add(key="location", value=location)
    return light


def _elements(tensor: onnx.TensorProto) -> int:
    return int(np.prod(tensor.dims)) if tensor.dims else 1


def _copy_field(message, descriptor, value) -> None:  # type: ignore[no-untyped-def]
    if descriptor.is_repeated:
        getattr(message, descriptor.name).extend(value)
    elif descriptor.type == descriptor.TYPE_MESSAGE:
        getattr(message, descriptor.name).CopyFrom(value)
    else:
        setattr(message, descriptor.name, value)


def save(model: ir.Model | onnx.ModelProto, path: str | os.PathLike[str]) -> None:
    """Write ``model`` atomically; weights go to ``<name>.data`` beside it when over 2 GB
    or when the input kept them there (a ``ModelProto``, from the direct path, is written
    as it is when it fits in one file, else through onnx_ir).

    The data file is written a tensor at a time (a converted weight a chunk at a time, see
    :mod:`graphamp.onnx.stream` and :mod:`graphamp.onnx.datafile`), so memory stays small
    whatever the model's size. The model and its data are written under temporary names in a
    hidden folder beside ``path`` and renamed into place together when both are complete: an
    error, an interrupt or a full disk leaves neither. A disk without room for the weights is
    refused before anything is written; one that fills up anyway is the same one-line error.
    """
    path = Path(path)
    if isinstance(model, onnx.ModelProto):
        if model.ByteSize() <= EXTERNAL_DATA_THRESHOLD:
            data = model.SerializeToString()
            with _disk_full_is_an_error(path, len(data)):
                write_atomic(path, data)
            return
        model = ir.serde.deserialize_model(model)
    external = (
        _weight_bytes(model) > EXTERNAL_DATA_THRESHOLD
        or _has_external(model)
        or bool(model.meta.get(EXTERNAL_DATA_KEY))
    )
    data_name = f"{path.name}.data"
    outside = _outside_values(model) if external else []
    needed = sum(value.const_value.nbytes for value in outside)  # type: ignore[union-attr]
    _check_room(path, needed)
    with (
        _disk_full_is_an_error(path, needed, "of weights"),
        tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp,
    ):
        tmp_path = Path(tmp) / path.name
        if external:
            _save_external(model, outside, tmp_path, data_name, needed)
            replace_together([(Path(tmp) / data_name, path.parent / data_name)], tmp_path, path)
        else:
            ir.save(model, tmp_path)
            replace_together([], tmp_path, path)


@contextmanager
def _disk_full_is_an_error(path: Path, size: int, what: str = "") -> Iterator[None]:
    """A full disk (or quota) while the block writes ``path`` is one line, not a traceback;
    the block leaves nothing behind on an error."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            written = f"{_size(size)} {what}".rstrip()
            raise GraphampError(
                f"{path}: {(exc.strerror or 'disk full').lower()} while writing "
                f"{written}; nothing was written"
            ) from None
        raise


EXTERNAL_MIN_BYTES = 1024  # tensors up to this size stay inside the model file


def _outside_values(model: ir.Model) -> list[ir.Value]:
    """The initializers whose data goes to the data file, in the order it is written (every
    graph's, in declaration order: one layer's weights stay adjacent on disk)."""
    return [
        value
        for graph in model.graphs()
        for value in graph.initializers.values()
        if value.const_value is not None and value.const_value.nbytes > EXTERNAL_MIN_BYTES
    ]


def _save_external(
    model: ir.Model, outside: list[ir.Value], model_path: Path, data_name: str, total: int
) -> None:
    """Write the data file tensor by tensor, then the model pointing into it. The model object
    is left as it was (its tensors are swapped for the written ones only while serialising)."""
    placed: list[ir.ExternalTensor] = []
    reporter = progress.current()
    reporter.begin("writing weights", total, len(outside))
    writer = DataFileWriter(model_path.parent / data_name)
    try:
        for value in outside:
            tensor = value.const_value
            offset = writer.length
            writer.write_all(stream.stored_bytes(tensor))  # type: ignore[arg-type]
            placed.append(
                ir.ExternalTensor(
                    data_name,
                    offset,
                    writer.length - offset,
                    tensor.dtype,  # type: ignore[union-attr]
                    shape=ir.Shape(tuple(tensor.shape)),  # type: ignore[union-attr]
                    name=value.name,
                    base_dir=model_path.parent,
                )
            )
            reporter.advance(writer.length - offset)
        writer.close()
    except BaseException:
        writer.abandon()
        raise
    finally:
        reporter.end()
    swapped = [*outside, *_small_external_values(model)]
    originals = [value.const_value for value in swapped]
    try:
        for value, tensor in zip(outside, placed, strict=True):
            value.const_value = tensor
        for value in swapped[len(outside) :]:  # small data the input kept outside comes inside
            value.const_value = ir.Tensor(value.const_value.numpy().copy(), name=value.name)  # type: ignore[union-attr]
        ir.save(model, model_path)
    finally:
        for value, tensor in zip(swapped, originals, strict=True):
            value.const_value = tensor


def _small_external_values(model: ir.Model) -> list[ir.Value]:
    return [
        value
        for graph in model.graphs()
        for value in graph.initializers.values()
        if isinstance(value.const_value, ir.ExternalTensor)
        and value.const_value.nbytes <= EXTERNAL_MIN_BYTES
    ]


def _check_room(path: Path, needed: int) -> None:
    free = shutil.disk_usage(path.parent).free
    if needed > free:
        raise GraphampError(
            f"{path}: the weights need {_size(needed)} and its disk has {_size(free)} free; "
            "nothing was written"
        )


def replace_together(data: list[tuple[Path, Path]], model_tmp: Path, model_path: Path) -> None:
    """Rename the data files, then the model, into place, with SIGINT and SIGTERM held back
    until all are done: an interrupt never leaves a model beside data of another conversion."""
    with _signals_held():
        for source, target in data:
            os.replace(source, target)
        os.replace(model_tmp, model_path)


@contextmanager
def _signals_held() -> Iterator[None]:
    held = {signal.SIGINT, signal.SIGTERM}
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, OSError, ValueError):  # no signal masks here (Windows)
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"


def _weight_bytes(model: ir.Model) -> int:
    return sum(
        v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None
    )


def _has_external(model: ir.Model) -> bool:
    return any(
        isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()
    )
