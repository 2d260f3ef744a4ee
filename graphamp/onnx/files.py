"""ONNX files in and out: load with type inference, save atomically with external data.

Type inference runs on a copy whose large initializers are data-less stubs, so a model of
hundreds of megabytes costs no copies of its weights. A model that suits the direct path
(:func:`graphamp.onnx.proto_reader.suits`) is read and written without onnx_ir, which is
imported only for the others (:mod:`graphamp.onnx.ir_files`).
"""

from __future__ import annotations

import logging
import os
import shutil  # noqa: F401  (tests make its disk look full through this module)
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from graphamp.core import progress
from graphamp.core.io import write_atomic
from graphamp.errors import GraphampError
from graphamp.onnx import declared, external, infile, proto_reader, type_view
from graphamp.onnx.datafile import DataFileWriter
from graphamp.onnx.infile import StreamedModel
from graphamp.onnx.order import functions_in_order, topologically_sorted
from graphamp.onnx.proto_reader import ProtoModel
from graphamp.onnx.validate import Checked, validate
from graphamp.onnx.validate_nodes import node_fields
from graphamp.onnx.writing import (
    EXTERNAL_DATA_THRESHOLD,
    check_not_a_source,
    check_room,
    disk_full_is_an_error,
    remember_source,
    replace_together,
)

if TYPE_CHECKING:
    import onnx_ir as ir

log = logging.getLogger(__name__)


def load(path: str | os.PathLike[str], *, direct: bool = False) -> ir.Model | ProtoModel:
    """Read an ONNX file (with its external data) and run type inference on it; with
    ``direct``, a :class:`ProtoModel` where the file suits the direct path, its large weights
    left in the file (:mod:`graphamp.onnx.infile`: read through memory maps, written as they
    are converted)."""
    path = Path(path)
    if not path.is_file():
        raise GraphampError(f"{path}: no such file")
    mapped = infile.read(path) if direct else None
    if mapped is None:
        model = _validated(_parse(path), str(path), path.parent, direct=direct)
        remember_source(model, path)  # save() refuses to write over it unasked
        return model
    where = str(path)
    lengths = {name: tensor.nbytes for name, tensor in mapped.tensors.items()}
    proto, checked = _checked(mapped.proto, where, path.parent, lengths)
    proto, inferred, note = _settled(proto, where, checked)
    if proto_reader.suits(proto, subgraphs=checked.subgraphs):
        value_info, types = _value_types(proto, inferred)
        weights, external = _external_weights(proto, path.parent)
        return ProtoModel(
            proto,
            value_info,
            types,
            checked.nodes,
            weights={**mapped.tensors, **weights},
            repaired=note,
            external=external,
        )
    if mapped.tensors:  # the onnx_ir path reads the weights from the proto: parse it whole
        whole = topologically_sorted(_parse(path), where)
        if proto is not mapped.proto:  # sorted or repaired: so is the whole proto
            whole, inferred, note = _settled(whole, where, checked)
        proto = whole
    model = _to_ir(proto, where, path.parent, inferred, note)
    remember_source(model, path)
    return model


def _external_weights(
    proto: onnx.ModelProto, base_dir: Path
) -> tuple[dict[str, infile.InFileTensor], bool]:
    """(where the main graph's weights in external data files lie, whether there are any).
    One that cannot be mapped (empty, or of a packed type) is read into ``proto`` (the
    caller's own parse of the file), as it would be held in memory."""
    graph = proto.graph
    if not any(init.data_location == onnx.TensorProto.EXTERNAL for init in graph.initializer):
        return {}, False
    weights = infile.external_tensors(graph, base_dir)
    for init in graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL and init.name not in weights:
            onnx.external_data_helper.load_external_data_for_tensor(init, str(base_dir))
            init.data_location = onnx.TensorProto.DEFAULT
            del init.external_data[:]
    return weights, True


def _parse(path: Path) -> onnx.ModelProto:
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises several unrelated types for bad bytes
        raise GraphampError(f"{path}: not an ONNX model ({type(exc).__name__}: {exc})") from None


def from_proto(
    proto: onnx.ModelProto, *, where: str = "model", base_dir: Path | None = None
) -> ir.Model:
    """An onnx_ir model from ``proto`` (not modified), with inferred value types."""
    model = _validated(proto, where, base_dir, direct=False)
    assert not isinstance(model, ProtoModel)
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
    proto, checked = _checked(proto, where, base_dir)
    proto, inferred, note = _settled(proto, where, checked)
    if direct and proto_reader.suits(proto, subgraphs=checked.subgraphs):
        value_info, types = _value_types(proto, inferred)
        return ProtoModel(proto, value_info, types, checked.nodes, repaired=note)
    return _to_ir(proto, where, base_dir, inferred, note)


def _to_ir(
    proto: onnx.ModelProto,
    where: str,
    base_dir: Path | None,
    inferred: onnx.ModelProto | None,
    note: str,
) -> ir.Model:
    from graphamp.onnx import ir_files

    model = ir_files.to_ir(proto, inferred, base_dir, where)
    model.meta[declared.REPAIRED_KEY] = note
    return model


def _checked(
    proto: onnx.ModelProto,
    where: str,
    base_dir: Path | None,
    in_file: dict[str, int] | None = None,
) -> tuple[onnx.ModelProto, Checked]:
    """``proto`` (a sorted copy where its nodes were out of topological order, as
    onnxruntime sorts them) and what validating it found."""
    if not isinstance(proto, onnx.ModelProto) or not proto.HasField("graph"):
        raise GraphampError(f"{where}: not an ONNX model (no graph)")
    if not proto.graph.node:
        raise GraphampError(f"{where}: the graph has no nodes")
    nodes = node_fields(proto.graph)
    # A model that validates as it is has its main graph in order (validation refuses a node
    # reading a value no earlier node produced), so the order check's walk is left to the few
    # that do not: those are sorted and validated again, and meet what they met before.
    try:
        checked = validate(proto, where=where, base_dir=base_dir, in_file=in_file, nodes=nodes)
    except Exception:  # anything: the path below raises what it raised before
        checked = None
    if checked is not None and functions_in_order(proto):
        return proto, checked
    ordered = topologically_sorted(proto, where, nodes)
    nodes = nodes if ordered is proto else None  # a sorted copy's are read again
    return ordered, validate(ordered, where=where, base_dir=base_dir, in_file=in_file, nodes=nodes)


def _settled(
    proto: onnx.ModelProto, where: str, checked: Checked
) -> tuple[onnx.ModelProto, onnx.ModelProto | None, str]:
    """(``proto`` or a copy whose main-graph declarations that type inference contradicts
    are repaired, its inferred types or None, the note of what was repaired):
    :mod:`graphamp.onnx.declared`, inference run once."""
    # No data propagation into bodies: it keys the values it computes by name across scopes,
    # and the branches of an Optimum merged decoder reuse each other's names, so one branch's
    # shapes land on the other's values; onnxruntime refuses the model written with them.
    settled = declared.checked(
        proto, where, _without_large_initializers, data_prop=not checked.subgraphs
    )
    if settled[1] is None:
        log.warning("%s: ONNX type inference failed; using local type rules", where)
    return settled


def _value_types(
    proto: onnx.ModelProto, inferred: onnx.ModelProto | None
) -> tuple[dict[str, onnx.ValueInfoProto], dict[str, bytes]]:
    """(the ValueInfoProto of each value the model declares: its inputs, value_info entries and
    outputs, which the writer reads; every typed value's serialised TypeProto, which the reader
    reads): the model's own where it gives a type and shape, else type inference's (as
    :func:`graphamp.onnx.ir_files.to_ir` types an onnx_ir model)."""
    graph = proto.graph
    own = {info.name: info for info in [*graph.input, *graph.value_info, *graph.output]}
    if inferred is None:
        return own, {name: info.type.SerializeToString() for name, info in own.items()}
    types = type_view.value_types(inferred)  # every value inference typed, read as bytes
    declared: dict[str, onnx.ValueInfoProto] = {}
    settled_by_inference = []
    for name, info in own.items():
        tensor_type = info.type.tensor_type
        if name not in types or (tensor_type.elem_type and tensor_type.HasField("shape")):
            declared[name] = info
            types[name] = info.type.SerializeToString()
        else:
            settled_by_inference.append(name)
    if settled_by_inference:  # their inferred entries, from a table built only for them
        found = {info.name: info for info in inferred.graph.value_info}
        found.update((info.name, info) for info in inferred.graph.output)
        declared.update((name, found[name]) for name in settled_by_inference)
    return declared, types


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


def save(
    model: ir.Model | onnx.ModelProto | StreamedModel,
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    read_from: Path | None = None,
) -> None:
    """Write ``model`` atomically; weights go to ``<name>.data`` beside it when over 2 GB
    or when the input kept them there (a ``ModelProto``, from the direct path, is written
    as it is when it fits in one file, else through onnx_ir).

    A path that would write over a file the model was read from (the model file or its
    external data, as :func:`graphamp.onnx.load` and :func:`graphamp.onnx.convert` of a path
    record it, or ``read_from``) is refused unless ``overwrite`` says so: the input is never
    overwritten unasked.

    The data file is written a tensor at a time (a converted weight a chunk at a time, see
    :mod:`graphamp.onnx.ir_files`), so memory stays small whatever the model's size. The model
    and its data are written under temporary names in a hidden folder beside ``path`` and
    renamed into place together when both are complete: an error, an interrupt or a full disk
    leaves neither. A disk without room for the weights is refused before anything is written;
    one that fills up anyway is the same one-line error.
    """
    path = Path(path)
    if not overwrite:
        check_not_a_source(model, path, read_from)
    if isinstance(model, StreamedModel):  # weights read (and converted) as they are written
        size = model.nbytes()
        if model.external or size > EXTERNAL_DATA_THRESHOLD:
            external.save(model, path)
            return
        check_room(path, size)
        with (
            disk_full_is_an_error(path, size),
            tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp,
        ):
            _write_pieces(Path(tmp) / path.name, model, size)
            replace_together([], Path(tmp) / path.name, path)
        return
    if isinstance(model, onnx.ModelProto):
        if model.ByteSize() <= EXTERNAL_DATA_THRESHOLD:
            data = model.SerializeToString()
            with disk_full_is_an_error(path, len(data)):
                write_atomic(path, data)
            return
        external.save(StreamedModel(model, {}, external=True), path)
        return
    from graphamp.onnx import ir_files

    ir_files.save(model, path)


def _write_pieces(path: Path, model: StreamedModel, size: int) -> None:
    """Write the serialised ``model`` to a new file ``path`` a piece at a time (its weights are
    read, and rounded, as they go), through the data file writer: the disk writes while the
    next weights are read and rounded, and the bytes skip the page cache."""
    reporter = progress.current()
    reporter.begin("writing the model", size, len(model.data))
    writer = DataFileWriter(path)
    try:
        for piece in model.pieces():
            writer.write(piece)
            reporter.advance(len(piece), 0)
        writer.close()
    except BaseException:
        writer.abandon()
        raise
    finally:
        reporter.end()
