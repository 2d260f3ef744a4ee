"""ONNX files in and out: load with type inference, save atomically with external data.

Type inference runs on a copy whose large initializers are data-less stubs, so a model of
hundreds of megabytes costs no copies of its weights. A file's large weights stay where they
are, in the file or its external data (:mod:`graphamp.onnx.io.infile`), until the converted model
is written (:func:`save`, :mod:`graphamp.onnx.io.external`).
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
from graphamp.onnx.io import infile, type_view
from graphamp.onnx.io.datafile import writing
from graphamp.onnx.io.infile import StreamedModel
from graphamp.onnx.io.proto_model import ProtoModel
from graphamp.onnx.io.subgraphs import graphs
from graphamp.onnx.io.writing import (
    EXTERNAL_DATA_THRESHOLD,
    check_not_a_source,
    check_room,
    disk_full_is_an_error,
    remember_source,
    replace_together,
)
from graphamp.onnx.validation import declared
from graphamp.onnx.validation.order import functions_in_order, topologically_sorted
from graphamp.onnx.validation.validate import Checked, validate
from graphamp.onnx.validation.validate_nodes import node_fields

if TYPE_CHECKING:
    import onnx_ir as ir
    from google.protobuf.descriptor import FieldDescriptor
    from google.protobuf.message import Message

log = logging.getLogger(__name__)
# An onnx_ir model's meta (one :meth:`graphamp.onnx.Conversion.model` built): its input kept
# its weights in external data, so saving it does too.
EXTERNAL_DATA_KEY = "graphamp.external_data"


def load(path: str | os.PathLike[str]) -> ir.Model:
    """The ONNX file at ``path`` as an onnx_ir model (``graphamp.onnx.load``): validated, the
    declarations inference contradicts repaired and every value typed by inference, as a
    conversion reads it; external data stays where it is. A conversion reads the protobuf
    itself (:func:`read_file`)."""
    from graphamp.onnx.io import ir_models

    path = _existing(path)
    proto, checked = _checked(_parse(path), str(path), path.parent)
    proto, inferred, note = _settled(proto, str(path), checked)
    declared.warn(note)
    model = ir_models.to_ir(proto, inferred, path.parent, str(path))
    model.meta[EXTERNAL_DATA_KEY] = ir_models.has_external(model)
    remember_source(model, path)  # save() refuses to write over it unasked
    return model


def from_proto(
    proto: onnx.ModelProto, *, where: str = "model", base_dir: Path | None = None
) -> ir.Model:
    """An onnx_ir model from ``proto`` (not modified), as :func:`load` gives a file's."""
    from graphamp.onnx.io import ir_models

    proto, checked = _checked(proto, where, base_dir)
    proto, inferred, note = _settled(proto, where, checked)
    declared.warn(note)
    return ir_models.to_ir(proto, inferred, base_dir, where)


def _existing(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    if not path.is_file():
        raise GraphampError(f"{path}: no such file")
    return path


def read_file(path: str | os.PathLike[str]) -> ProtoModel:
    """The ONNX file at ``path`` as a conversion reads it, validated and typed by inference:
    its large weights left in the file or its external data (:mod:`graphamp.onnx.io.infile`:
    read through memory maps, written as they are converted)."""
    path = _existing(path)
    mapped = infile.read(path)
    if mapped is None:  # a file laid out otherwise: protobuf parses it whole
        proto, tensors = _parse(path), {}
    else:
        proto, tensors = mapped.proto, mapped.tensors
    lengths = {name: tensor.nbytes for name, tensor in tensors.items()}
    model = _validated(proto, str(path), path.parent, lengths)
    weights, kept_outside = _external_weights(model.proto, path.parent)
    model.weights, model.external = {**tensors, **weights}, kept_outside
    return model


def _external_weights(
    proto: onnx.ModelProto, base_dir: Path
) -> tuple[dict[str, infile.InFileTensor], bool]:
    """(where the main graph's weights in external data files lie, whether there are any).
    One that cannot be mapped (empty, or of a packed type), and a body's, are read into
    ``proto`` (the caller's own parse of the file), as they would be held in memory."""
    every = list(graphs(proto.graph))
    if not any(
        init.data_location == onnx.TensorProto.EXTERNAL
        for graph in every
        for init in graph.initializer
    ):
        return {}, False
    weights = infile.external_tensors(proto.graph, base_dir)
    for depth, graph in enumerate(every):  # the main graph first
        for init in graph.initializer:
            if init.data_location != onnx.TensorProto.EXTERNAL or (
                depth == 0 and init.name in weights
            ):
                continue
            onnx.external_data_helper.load_external_data_for_tensor(init, str(base_dir))
            init.data_location = onnx.TensorProto.DEFAULT
            del init.external_data[:]
    return weights, True


def _parse(path: Path) -> onnx.ModelProto:
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises several unrelated types for bad bytes
        if _is_lfs_pointer(path):
            raise GraphampError(
                f"{path}: a Git LFS pointer, not the model it stands for: fetch the model "
                "(git lfs pull; in CI, check out with LFS files)"
            ) from None
        first = (str(exc).strip().splitlines() or [""])[0]  # protobuf lists every field next
        raise GraphampError(
            f"{path}: not an ONNX model, or a truncated or damaged one "
            f"({type(exc).__name__}: {first})"
        ) from None


def _is_lfs_pointer(path: Path) -> bool:
    """Whether ``path`` holds a Git LFS pointer (a small text file that a clone without LFS
    checks out in place of the model)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(64).startswith(b"version https://git-lfs.github.com/spec/")
    except OSError:
        return False


def read_proto(
    proto: onnx.ModelProto, *, where: str = "model", base_dir: Path | None = None
) -> ProtoModel:
    """``proto`` (not modified) as a conversion reads it, validated and typed by inference."""
    return _validated(proto, where, base_dir)


def _validated(
    proto: onnx.ModelProto,
    where: str,
    base_dir: Path | None,
    in_file: dict[str, int] | None = None,
) -> ProtoModel:
    proto, checked = _checked(proto, where, base_dir, in_file)
    proto, inferred, note = _settled(proto, where, checked)
    return _proto_model(proto, checked, inferred, note)


def _proto_model(
    proto: onnx.ModelProto, checked: Checked, inferred: onnx.ModelProto | None, note: str
) -> ProtoModel:
    """The :class:`ProtoModel` of a validated, settled ``proto``."""
    value_info, types = _value_types(proto, inferred)
    nested = checked.subgraphs or bool(proto.functions)
    return ProtoModel(
        proto,
        value_info,
        types,
        checked.nodes,
        repaired=note,
        nested=nested,
        inferred=inferred if nested else None,
    )


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
    read = nodes if ordered is proto else None  # a sorted copy's are read again
    return ordered, validate(ordered, where=where, base_dir=base_dir, in_file=in_file, nodes=read)


def _settled(
    proto: onnx.ModelProto, where: str, checked: Checked
) -> tuple[onnx.ModelProto, onnx.ModelProto | None, str]:
    """(``proto`` or a copy whose main-graph declarations that type inference contradicts
    are repaired, its inferred types or None, the note of what was repaired):
    :mod:`graphamp.onnx.validation.declared`, inference run once."""
    # No data propagation into bodies: it keys the values it computes by name across scopes,
    # and the branches of an Optimum merged decoder reuse each other's names, so one branch's
    # shapes land on the other's values; onnxruntime refuses the model written with them.
    settled = declared.checked(
        proto, where, without_large_initializers, data_prop=not checked.subgraphs
    )
    if settled[1] is None:
        log.warning("%s: ONNX type inference failed; using local type rules", where)
    return settled


def _value_types(
    proto: onnx.ModelProto, inferred: onnx.ModelProto | None
) -> tuple[dict[str, onnx.ValueInfoProto], dict[str, bytes]]:
    """:func:`graphamp.onnx.io.type_view.settled_types` of the main graph, inference's types
    read as bytes in one parse."""
    if inferred is None:
        return type_view.settled_types(proto.graph, None)
    return type_view.settled_types(proto.graph, inferred.graph, type_view.value_types(inferred))


def inferred_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> ONNX element type for every typed value of ``proto``'s main graph
    (graph I/O, initializers, and what type inference finds), without copying weights."""
    inferred = onnx.shape_inference.infer_shapes(without_large_initializers(proto))
    types = {init.name: init.data_type for init in proto.graph.initializer}
    for info in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        if info.type.HasField("tensor_type"):
            types[info.name] = info.type.tensor_type.elem_type
    return types


TYPE_INFERENCE_STUB = "graphamp-type-inference-stub"  # the stubs' external data location


def without_large_initializers(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` whose initializers of over 256 elements are data-less external
    stubs (small ones stay: shape computations read their values). Nothing big is copied."""
    large = {init.name for init in proto.graph.initializer if _elements(init) > 256}
    if not large:
        return proto
    return with_stubs(proto, large, TYPE_INFERENCE_STUB)


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


def _copy_field(message: Message, descriptor: FieldDescriptor, value: object) -> None:
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
    or when the input kept them there (:mod:`graphamp.onnx.io.external`).

    A path that would write over a file the model was read from (the model file or its
    external data, as :func:`graphamp.onnx.load` and :func:`graphamp.onnx.convert` of a path
    record it, or ``read_from``) is refused unless ``overwrite`` says so: the input is never
    overwritten unasked.

    A converted model's weights still in the input are written a tensor at a time (a
    converted one a chunk at a time), so memory stays small whatever the model's size. The
    model and its data are written under temporary names in a hidden folder beside ``path``
    and renamed into place together when both are complete: an error, an interrupt or a full
    disk leaves neither. A disk without room for the weights is refused before anything is
    written; one that fills up anyway is the same one-line error.
    """
    path = Path(path)
    if not overwrite:
        check_not_a_source(model, path, read_from)
    if not isinstance(model, StreamedModel | onnx.ModelProto):  # an onnx_ir model
        model = _from_ir(model)
    if isinstance(model, onnx.ModelProto):
        if model.ByteSize() <= EXTERNAL_DATA_THRESHOLD:
            data = model.SerializeToString()
            with disk_full_is_an_error(path, len(data)):
                write_atomic(path, data)
            return
        model = StreamedModel(model, {}, external=True)
    size = model.nbytes()
    if model.external or size > EXTERNAL_DATA_THRESHOLD:
        from graphamp.onnx.io import external

        external.save(model, path)
        return
    check_room(path, size)
    with (
        disk_full_is_an_error(path, size),
        tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp,
    ):
        _write_pieces(Path(tmp) / path.name, model, size)
        replace_together([], Path(tmp) / path.name, path)


def _from_ir(model: ir.Model) -> onnx.ModelProto | StreamedModel:
    """An onnx_ir model as the proto it serialises to; the main graph's weights it keeps in
    external data are read from there as they are written, and so is the output's."""
    import onnx_ir as ir

    proto = ir.to_proto(model)
    data: dict[int, infile.Data] = {}
    for position, value in enumerate(model.graph.initializers.values()):
        tensor = value.const_value
        if isinstance(tensor, ir.ExternalTensor):
            stub = proto.graph.initializer[position]
            stub.ClearField("data_location")
            del stub.external_data[:]
            path = os.fspath(tensor.path)
            data[position] = infile.InFileTensor(
                path,
                tensor.offset or 0,
                tensor.nbytes,
                tensor.dtype.value,
                tuple(tensor.shape.numpy()),
                infile.stamp(path),
                external=True,
            )
    outside = bool(data) or bool(model.meta.get(EXTERNAL_DATA_KEY))
    return StreamedModel(proto, data, external=True) if outside else proto


def _write_pieces(path: Path, model: StreamedModel, size: int) -> None:
    """Write the serialised ``model`` to a new file ``path`` a piece at a time (its weights are
    read, and rounded, as they go), through the data file writer: the disk writes while the
    next weights are read and rounded, and the bytes skip the page cache."""
    reporter = progress.current()
    with writing(path, "writing the model", size, len(model.data)) as writer:
        for piece in model.pieces():
            writer.write(piece)
            reporter.advance(len(piece), 0)
