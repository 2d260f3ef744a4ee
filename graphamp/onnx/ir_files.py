"""onnx_ir models from protos and into files (the path for models with subgraphs, local
functions or external data, and for ``onnx_ir.Model`` objects).

A model whose weights lived outside keeps them outside: its data file is written a tensor at a
time (a converted weight a chunk at a time, see :mod:`graphamp.onnx.ir_tensors` and
:mod:`graphamp.onnx.datafile`), so memory stays small whatever the model's size.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx
import onnx_ir as ir

from graphamp.core import progress
from graphamp.core.io import temp_prefix
from graphamp.errors import GraphampError, WeightOverflow
from graphamp.onnx import ir_tensors
from graphamp.onnx.datafile import DataFileWriter
from graphamp.onnx.infile import Converted, StreamedModel
from graphamp.onnx.writing import (
    EXTERNAL_DATA_THRESHOLD,
    check_room,
    disk_full_is_an_error,
    replace_together,
)

EXTERNAL_DATA_KEY = "graphamp.external_data"


def to_ir(
    proto: onnx.ModelProto, inferred: onnx.ModelProto | None, base_dir: Path | None, where: str
) -> ir.Model:
    """The onnx_ir model of ``proto`` (not modified), typed by ``inferred`` (``proto`` after ONNX
    type inference, or None where it failed)."""
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as exc:
        raise GraphampError(f"{where}: malformed ONNX model ({exc})") from None
    if inferred is not None:
        _apply_inferred_types(model, inferred)
    if base_dir is not None:
        ir.external_data.set_base_dir(model.graph, base_dir)
    # Remembered for save(): a model whose weights lived outside keeps them outside.
    model.meta[EXTERNAL_DATA_KEY] = _has_external(model)
    return model


def _apply_inferred_types(model: ir.Model, inferred: onnx.ModelProto) -> None:
    """Type every value that ONNX type inference typed in ``inferred``, in the main graph and
    in every body of its nodes."""
    # Values share few distinct types (a chain of 50,000 nodes may have one): each distinct
    # TypeProto is deserialised once. Every value gets its own type (a retype changes it in
    # place) and shares a frozen shape (nothing changes a shape; onnx_ir refuses if tried).
    known: dict[bytes, tuple[ir.TypeProtocol, ir.Shape | None]] = {}
    _type_graph(model.graph, inferred.graph, known)


def _type_graph(
    graph: ir.Graph,
    inferred: onnx.GraphProto,
    known: dict[bytes, tuple[ir.TypeProtocol, ir.Shape | None]],
) -> None:
    values = {v.name: v for v in graph.inputs}
    for node in graph:
        for value in node.outputs:
            values[value.name] = value
    for info in [*inferred.value_info, *inferred.output]:
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
    # inference types the values inside bodies too: the same graphs, node for node
    for node, inferred_node in zip(graph, inferred.node, strict=False):
        for attribute in inferred_node.attribute:
            found = node.attributes.get(attribute.name)
            if attribute.type == onnx.AttributeProto.GRAPH and found is not None:
                _type_graph(found.value, attribute.g, known)
            elif attribute.type == onnx.AttributeProto.GRAPHS and found is not None:
                for body, inferred_body in zip(found.value, attribute.graphs, strict=False):
                    _type_graph(body, inferred_body, known)


def save(model: ir.Model, path: Path) -> None:
    """Write ``model`` atomically; weights go to ``<name>.data`` beside it when over 2 GB or
    when the input kept them there (see :func:`graphamp.onnx.files.save`)."""
    external = (
        _weight_bytes(model) > EXTERNAL_DATA_THRESHOLD
        or _has_external(model)
        or bool(model.meta.get(EXTERNAL_DATA_KEY))
    )
    data_name = f"{path.name}.data"
    outside = _outside_values(model) if external else []
    needed = sum(value.const_value.nbytes for value in outside)  # type: ignore[union-attr]
    check_room(path, needed)
    try:
        with (
            disk_full_is_an_error(path, needed, "of weights"),
            tempfile.TemporaryDirectory(dir=path.parent, prefix=temp_prefix(path)) as tmp,
        ):
            tmp_path = Path(tmp) / path.name
            if external:
                _save_external(model, outside, tmp_path, data_name, needed)
                replace_together([(Path(tmp) / data_name, path.parent / data_name)], tmp_path, path)
            else:
                ir.save(model, tmp_path)
                replace_together([], tmp_path, path)
    except Exception as exc:
        # A weight converted as onnx_ir serialises it (one small enough to stay inside the
        # model file) raises WeightOverflow wrapped in onnx_ir's SerdeError: the caller starts
        # the conversion over on the WeightOverflow itself, so hand that on unwrapped.
        overflow = _weight_overflow_in(exc)
        if overflow is None or overflow is exc:
            raise
        raise overflow from None


def _weight_overflow_in(exc: BaseException | None) -> WeightOverflow | None:
    """The WeightOverflow ``exc`` is or was caused by, if any."""
    while exc is not None:
        if isinstance(exc, WeightOverflow):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


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
            writer.write_all(ir_tensors.stored_bytes(tensor))  # type: ignore[arg-type]
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


def _weight_bytes(model: ir.Model) -> int:
    return sum(
        v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None
    )


def _has_external(model: ir.Model) -> bool:
    return any(
        isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()
    )


def from_streamed(model: StreamedModel) -> ir.Model:
    """An onnx_ir model of ``model`` whose streamed weights point into the file they are read
    from (converted ones as :class:`~graphamp.onnx.ir_tensors.ConvertedTensor`): for an output
    too large for one file, saved with external data a tensor at a time."""
    converted = ir.serde.deserialize_model(model.proto)
    values = list(converted.graph.initializers.values())
    for position, data in model.data.items():
        value = values[position]
        source = data.source if isinstance(data, Converted) else data
        source.check_unchanged()
        path = Path(source.path)
        tensor: ir.TensorProtocol = ir.ExternalTensor(
            path.name,
            source.offset,
            source.nbytes,
            ir.DataType(source.data_type),
            shape=ir.Shape(source.dims),
            name=value.name,
            base_dir=path.parent,
        )
        if isinstance(data, Converted):
            tensor = ir_tensors.ConvertedTensor(tensor, data.dst, str(value.name), data.record)
        value.const_value = tensor
    converted.meta[EXTERNAL_DATA_KEY] = True  # too large for one file: that is why it is here
    return converted
