"""Writing a converted model with its weights in an external data file, a tensor at a time.

A model whose input kept its weights in external data, and one too large for a single protobuf
file, is written as two files: ``<name>`` with the graph and the small tensors, and
``<name>.data`` with the data of every initializer over :data:`EXTERNAL_MIN_BYTES`, one after
the other in the order of the graphs (the main graph, then each body, depth first) and of their
declarations, so one layer's weights stay adjacent on disk. Each weight is read (and rounded)
from where the input keeps it as it is written (:mod:`graphamp.onnx.io.infile`), through the data
file writer (:mod:`graphamp.onnx.io.datafile`): memory stays small whatever the model's size.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx import numpy_helper

from graphamp.core import dtypes, progress
from graphamp.core.io import temp_prefix
from graphamp.onnx.io.datafile import writing
from graphamp.onnx.io.infile import Data, StreamedModel
from graphamp.onnx.io.subgraphs import graphs
from graphamp.onnx.io.writing import check_room, disk_full_is_an_error, replace_together

EXTERNAL_MIN_BYTES = 1024  # tensors up to this size stay inside the model file
_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "string_data", "int64_data",
                "double_data", "uint64_data")  # fmt: skip

# One initializer written to the data file: its proto (to become a stub pointing there), where
# its bytes come from (the input's file, or the proto itself), and how many there are.
_Outside = tuple[onnx.TensorProto, Data | None, int]


def save(model: StreamedModel, path: Path) -> None:
    """Write ``model`` to ``path`` and its large weights to ``<name>.data`` beside it, both
    renamed into place together once complete; a disk without room for the weights is
    refused before anything is written."""
    data_name = f"{path.name}.data"
    out = onnx.ModelProto()
    out.CopyFrom(model.proto)
    outside = _settle(out, model.data)
    needed = sum(nbytes for _, _, nbytes in outside)
    check_room(path, needed)
    with (
        disk_full_is_an_error(path, needed, "of weights"),
        tempfile.TemporaryDirectory(dir=path.parent, prefix=temp_prefix(path)) as tmp,
    ):
        data_path = Path(tmp) / data_name
        _write_data(outside, data_path, data_name, needed)
        model_path = Path(tmp) / path.name
        model_path.write_bytes(out.SerializeToString())
        replace_together([(data_path, path.parent / data_name)], model_path, path)


def _settle(out: onnx.ModelProto, data: dict[int, Data]) -> list[_Outside]:
    """The initializers of ``out`` that go to the data file, in the order written; a small
    one whose data is elsewhere (``data``, by position among the main graph's initializers)
    gets it in the proto."""
    outside: list[_Outside] = []
    for depth, graph in enumerate(graphs(out.graph)):
        for position, tensor in enumerate(graph.initializer):
            source = data.get(position) if depth == 0 else None
            nbytes = source.nbytes if source is not None else _stored_bytes(tensor)
            if nbytes is not None and nbytes > EXTERNAL_MIN_BYTES:
                outside.append((tensor, source, nbytes))
            elif source is not None:
                tensor.raw_data = b"".join(source.byte_chunks())
    return outside


def _stored_bytes(tensor: onnx.TensorProto) -> int | None:
    """The bytes of a tensor held in the proto as a data file stores them; None for one that
    stays in the proto (strings, packed types held in typed fields, external data)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    named = dtypes.BY_ONNX.get(tensor.data_type)
    if named is None or named.name == "string":
        return None
    return math.prod(tensor.dims) * dtypes.itemsize(named.name)


def _tensor_bytes(tensor: onnx.TensorProto, source: Data | None) -> Iterator[bytes | memoryview]:
    if source is not None:
        yield from source.byte_chunks()
    elif tensor.HasField("raw_data"):
        yield tensor.raw_data
    else:  # a typed field: little-endian, as raw_data holds it
        values = numpy_helper.to_array(tensor)
        yield values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes()


def _write_data(outside: list[_Outside], data_path: Path, data_name: str, total: int) -> None:
    """Write each weight's bytes to the data file and make its proto a stub pointing there."""
    reporter = progress.current()
    with writing(data_path, "writing weights", total, len(outside)) as writer:
        for tensor, source, _ in outside:
            offset = writer.length
            writer.write_all(_tensor_bytes(tensor, source))
            for name in _DATA_FIELDS:
                tensor.ClearField(name)
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", offset),
                               ("length", writer.length - offset)):  # fmt: skip
                tensor.external_data.add(key=key, value=str(value))
            reporter.advance(writer.length - offset)
