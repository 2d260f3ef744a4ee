"""Models that keep their weights inside the ``.onnx`` file (every model under 2 GB, most that
users have): read without holding the weights, written as they are converted.

Reading: the file is scanned in protobuf's wire format (:mod:`graphamp.onnx.io.wire`) and parsed
without the ``raw_data`` of its large initializers, which stay in the file as
:class:`InFileTensor` slices of it: the passes see them through memory maps that go as soon as
the range scan lets go of them, as they see external data (:mod:`graphamp.onnx.io.stream`).

Writing: a converted model whose weights are such slices is a :class:`StreamedModel`: the
output proto with those tensors data-less, and for each what its ``raw_data`` is made of (the
input's bytes, or those bytes rounded to the target type). :meth:`StreamedModel.pieces` gives
the output file's bytes a piece at a time: protobuf's serialisation of the data-less proto,
with each ``raw_data`` put back where protobuf writes it (a tensor's fields go in number order:
after ``name``, 8, before ``doc_string``, 12) and the lengths of the tensor and the graph
around it grown to match. So the file is byte for byte ``to_proto().SerializeToString()``,
which is what the model held in memory would give, in a fraction of the memory.

Anything this does not recognise (a truncated file, an initializer with fields this onnx does
not know, a graph given twice) is left to protobuf: such a file is parsed whole, as before.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import onnx

from graphamp.core import dtypes
from graphamp.errors import GraphampError, InternalError
from graphamp.onnx.io import stream, wire
from graphamp.plans.records import WeightRecord

MAP_MIN_BYTES = 4096  # raw_data above this stays in the file (so more than 256 elements)
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA, _TENSOR_DATA_LOCATION = 7, 5, 9, 14
_TENSOR_FIELDS = frozenset(f.number for f in onnx.TensorProto.DESCRIPTOR.fields)


@dataclass(frozen=True)
class InFileTensor:
    """The ``raw_data`` of an initializer, where it lies in its model file."""

    path: str
    offset: int
    nbytes: int
    data_type: int  # ONNX element type
    dims: tuple[int, ...]
    stamp: tuple[int, int, int]  # the file's inode, size and mtime when it was read
    # In an external data file (read once, and maybe larger than memory: each range leaves
    # the page cache once written), not in the model file (smaller than memory, kept cached).
    external: bool = False

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(dtypes.numpy_type(dtypes.BY_ONNX[self.data_type].name))

    @property
    def size(self) -> int:
        return math.prod(self.dims)

    def numpy(self, budget: stream.CacheBudget | None = None) -> np.ndarray:
        """The values as a new read-only memory map of the file (nothing read until touched;
        ``budget``: what of the scanned data stays cached, see :class:`stream.CacheBudget`)."""
        self.check_unchanged()
        return stream.map_values(self.path, self.offset, self.dtype, self.dims, budget)

    def chunks(self) -> Iterator[np.ndarray]:
        """The values, flattened, a chunk at a time (read with pread into one buffer; the pages
        of a model file stay cached, those of external data go: see ``external``)."""
        self.check_unchanged()
        return stream.read_chunks(self.path, self.offset, self.dtype, self.size, drop=self.external)

    @property
    def source(self) -> InFileTensor:
        """The tensor in the input these bytes are read from: this one (as :class:`Data`)."""
        return self

    def byte_chunks(self) -> Iterator[memoryview]:
        for chunk in self.chunks():
            yield stream.bytes_of(chunk)

    def check_unchanged(self) -> None:
        """Refuse to read a model file that was replaced or changed since it was read."""
        if stamp(self.path) != self.stamp:
            raise GraphampError(f"{self.path}: the file changed while it was being converted")


@dataclass
class Converted:
    """``source`` rounded to ``dst``, chunk by chunk, when its bytes are asked for (the counts
    go into ``record``, see :func:`graphamp.onnx.io.stream.converted_chunks`)."""

    source: InFileTensor
    dst: str
    record: WeightRecord

    @property
    def nbytes(self) -> int:
        return self.source.size * dtypes.itemsize(self.dst)

    def byte_chunks(self) -> Iterator[memoryview]:
        chunks = self.source.chunks()
        for converted in stream.converted_chunks(chunks, self.dst, self.record.name, self.record):
            yield stream.bytes_of(converted)


class Data(Protocol):
    """A weight's raw_data in a :class:`StreamedModel`, made as the model is written: its
    length, its bytes a chunk at a time, and the tensor in the input they are made from
    (an :class:`InFileTensor` itself, a :class:`Converted`, a float8 dialect's weight)."""

    @property
    def nbytes(self) -> int: ...

    @property
    def source(self) -> InFileTensor: ...

    def byte_chunks(self) -> Iterator[memoryview]: ...


@dataclass
class MappedModel:
    """A model file parsed without its large weights: ``proto`` holds them data-less (name,
    type and dims only) and ``tensors`` where their bytes are."""

    proto: onnx.ModelProto
    tensors: dict[str, InFileTensor] = field(default_factory=dict)


def read(path: str | os.PathLike[str]) -> MappedModel | None:
    """The model at ``path`` with the ``raw_data`` of its initializers over
    :data:`MAP_MIN_BYTES` left in the file; None where the file is not laid out as this reads
    it (then protobuf parses it whole)."""
    path = str(path)
    stamped = stamp(path)
    with open(path, "rb") as file:
        try:
            light, found = _light_bytes(_Window(file.fileno(), stamped[1]), path, stamped)
        except wire.WireError:
            return None
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(light)
    except Exception:  # protobuf's own error comes from parsing the whole file
        return None
    return MappedModel(proto, found)


def external_tensors(
    graph: onnx.GraphProto, base_dir: str | os.PathLike[str]
) -> dict[str, InFileTensor]:
    """Where the data of each of ``graph``'s initializers kept in an external data file lies
    (validation has checked that it does: inside ``base_dir``, long enough); an empty one, or
    one of a type numpy does not hold as it is stored (packed sub-byte types), is left out."""
    found: dict[str, InFileTensor] = {}
    stamps: dict[str, tuple[int, int, int]] = {}
    for tensor in graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        named = dtypes.BY_ONNX.get(tensor.data_type)
        if named is None or named.name == "string":
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        path = os.path.join(base_dir, info["location"])
        if path not in stamps:
            stamps[path] = stamp(path)
        dims = tuple(tensor.dims)
        nbytes = math.prod(dims) * dtypes.itemsize(named.name)
        if not nbytes:  # nothing to map: read into the proto with the others left out
            continue
        offset = int(info.get("offset", 0))
        found[tensor.name] = InFileTensor(
            path, offset, nbytes, tensor.data_type, dims, stamps[path], external=True
        )
    return found


class _Window:
    """A file read through a small window that follows the reads: the fields' keys and
    lengths are read without the values between them (a memory map would do, but reading a
    byte of one maps the whole folio around it, up to megabytes of resident memory per weight
    on a file system with large folios)."""

    SIZE = 1 << 16

    def __init__(self, fd: int, length: int) -> None:
        self.fd, self.length = fd, length
        self.start, self.data = 0, b""

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: slice) -> bytes:
        start = max(index.start or 0, 0)
        stop = self.length if index.stop is None else min(index.stop, self.length)
        if stop - start > self.SIZE:  # a long run (the nodes before a weight): read it as is
            return os.pread(self.fd, stop - start, start)
        if not (self.start <= start and stop <= self.start + len(self.data)):
            self.start, self.data = start, os.pread(self.fd, self.SIZE, start)
        return self.data[start - self.start : stop - self.start]


def stamp(path: str) -> tuple[int, int, int]:
    """A file's inode, size and mtime: what tells a changed file from the one read."""
    status = os.stat(path)
    return status.st_ino, status.st_size, status.st_mtime_ns


def _light_bytes(
    buffer: _Window, path: str, stamp: tuple[int, int, int]
) -> tuple[bytes, dict[str, InFileTensor]]:
    """The model's bytes with the large initializers' raw_data fields cut out, and those."""
    graphs = [f for f in wire.fields(buffer, 0, len(buffer)) if f.number == _MODEL_GRAPH]
    if len(graphs) != 1 or graphs[0].wire_type != wire.LENGTH_DELIMITED:
        raise wire.WireError("not one graph")  # protobuf merges repeated ones: leave it that
    graph = graphs[0]
    pieces: list[bytes] = []
    found: dict[str, InFileTensor] = {}
    copied = graph.data  # graph bytes up to here are in pieces (or to be copied as they are)
    for entry in wire.fields(buffer, graph.data, graph.end):
        if entry.number != _GRAPH_INITIALIZER or entry.wire_type != wire.LENGTH_DELIMITED:
            continue
        stub = _stub(buffer, entry, path, stamp)
        if stub is None:
            continue
        name, tensor_bytes, tensor = stub
        pieces += (buffer[copied : entry.start], wire.field(_GRAPH_INITIALIZER, tensor_bytes))
        copied = entry.end
        found.setdefault(name, tensor)  # a name stored twice: validation refuses the model
    pieces.append(buffer[copied : graph.end])
    light_graph = b"".join(pieces)
    head, tail = buffer[: graph.start], buffer[graph.end :]
    return head + wire.field(_MODEL_GRAPH, light_graph) + tail, found


def _stub(
    buffer: _Window, entry: wire.Field, path: str, stamp: tuple[int, int, int]
) -> tuple[str, bytes, InFileTensor] | None:
    """An initializer's name, its bytes without its raw_data, and where that lies; None for one that
    stays whole (small, external, several raw_data fields, unknown fields, a type numpy does
    not hold as it is stored)."""
    raw = []
    for part in wire.fields(buffer, entry.data, entry.end):
        if part.number not in _TENSOR_FIELDS:
            return None
        if part.number == _TENSOR_DATA_LOCATION and part.value != onnx.TensorProto.DEFAULT:
            return None
        if part.number == _TENSOR_RAW_DATA:
            raw.append(part)
    if len(raw) != 1 or raw[0].end - raw[0].data <= MAP_MIN_BYTES:
        return None
    data = raw[0]
    tensor_bytes = buffer[entry.data : data.start] + buffer[data.end : entry.end]
    tensor = onnx.TensorProto.FromString(tensor_bytes)
    named = dtypes.BY_ONNX.get(tensor.data_type)
    if named is None or named.name == "string" or any(d < 0 for d in tensor.dims):
        return None
    where = InFileTensor(
        path, data.data, data.end - data.data, tensor.data_type, tuple(tensor.dims), stamp
    )
    return tensor.name, tensor_bytes, where


@dataclass
class StreamedModel:
    """A converted model whose large weights are not in memory: ``proto`` holds them
    data-less, and ``data`` what each one's raw_data is, by its position in
    ``proto.graph.initializer`` (see the module docstring)."""

    proto: onnx.ModelProto
    data: dict[int, Data]
    # The input kept its weights in an external data file: so does the output.
    external: bool = False

    def pieces(self) -> Iterator[bytes | memoryview]:
        """The serialised model, a piece at a time: what ``to_proto().SerializeToString()``
        gives, without the weights in memory."""
        layout = _Layout(self.proto.SerializeToString(), self.data)
        yield from layout.pieces()

    def nbytes(self) -> int:
        """The size of the serialised model."""
        return _Layout(self.proto.SerializeToString(), self.data).nbytes

    def to_proto(self) -> onnx.ModelProto:
        """The model with every weight in it (as much memory as its size)."""
        proto = onnx.ModelProto()
        proto.CopyFrom(self.proto)
        for position, data in self.data.items():
            tensor = proto.graph.initializer[position]
            tensor.raw_data = b"".join(data.byte_chunks())
        return proto


class _Layout:
    """Where the raw_data fields go in the serialised data-less model, and the lengths of the
    messages around them."""

    def __init__(self, light: bytes, data: dict[int, Data]) -> None:
        self.light, self.data = light, data
        graphs = [f for f in wire.fields(light, 0, len(light)) if f.number == _MODEL_GRAPH]
        self.graph = graphs[0]
        # per streamed initializer: its field, where raw_data goes in it, its new length
        self.tensors: list[tuple[wire.Field, int, int, Data]] = []
        position = 0
        for entry in wire.fields(light, self.graph.data, self.graph.end):
            if entry.number != _GRAPH_INITIALIZER:
                continue
            found = data.get(position)
            position += 1
            if found is None:
                continue
            # known fields come in number order, unknown ones after them (none here: see read)
            after = next(
                (
                    f.start
                    for f in wire.fields(light, entry.data, entry.end)
                    if f.number > _TENSOR_RAW_DATA
                ),
                entry.end,
            )
            length = entry.end - entry.data + len(wire.header(_TENSOR_RAW_DATA, found.nbytes))
            self.tensors.append((entry, after, length + found.nbytes, found))
        if len(self.tensors) != len(data):
            raise InternalError("weights given for initializers the model does not have")
        growth = sum(
            len(wire.header(_GRAPH_INITIALIZER, length)) + length - (entry.end - entry.start)
            for entry, _, length, _ in self.tensors
        )
        self.graph_length = self.graph.end - self.graph.data + growth
        head = len(wire.header(_MODEL_GRAPH, self.graph_length))
        self.nbytes = len(light) - (self.graph.end - self.graph.start) + head + self.graph_length

    def pieces(self) -> Iterator[bytes | memoryview]:
        light = memoryview(self.light)
        yield light[: self.graph.start]
        yield wire.header(_MODEL_GRAPH, self.graph_length)
        copied = self.graph.data
        for entry, after, length, data in self.tensors:
            yield light[copied : entry.start]
            yield wire.header(_GRAPH_INITIALIZER, length)
            yield light[entry.data : after]
            yield wire.header(_TENSOR_RAW_DATA, data.nbytes)
            written = 0
            for chunk in data.byte_chunks():
                written += chunk.nbytes
                yield chunk
            if written != data.nbytes:  # the field's length is written: it must be right
                raise InternalError(f"a weight gave {written} bytes, not {data.nbytes}")
            copied = after
        yield light[copied:]
