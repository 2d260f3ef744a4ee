"""Float8 in ONNX models: the QuantizeLinear/DequantizeLinear pairs and float8 weights the
plan's scale records ask for, written into a converted model.

The ``fp8`` pass (:mod:`graphamp.passes.fp8`) decides which matrix ops take float8 operands and
records each quantised value's scale; the writer has already converted the model to its low
type. This module then, for a static recipe (scales fixed at conversion):

* an activation read by float8 ops gets ``QuantizeLinear -> DequantizeLinear`` once, shared by
  its float8 readers, at scale max|x| * 2**margin / 448 from calibration (a scalar in the low
  type, a float8 zero point), ``saturate`` left at 1: a value past the headroom saturates;
* a weight is stored as ``float8_e4m3fn`` with one scale per output channel (max |w| / 448 over
  the channel, in the low type, from the float32 weight), and a ``DequantizeLinear`` (axis: the
  weight's N axis) gives its float8 readers the low type; the low copy stays only if another op
  still reads it;
* an embedding table (``Float8(embeddings=True)``, scale records of format ``int8``) is
  stored int8 with one scale per row (max |row| / 127 in the low type, rounded up, from the
  float32 table); each Gather reading it reads the int8 table, a second Gather reads the
  scales (a [rows, 1] vector) with the same indices, and ``Cast`` to the low type then ``Mul``
  give the rows the Gather gave before: only the gathered rows are dequantised, and both
  runtimes compute them exactly (an int8 times a 16-bit scale is one rounding). Not a
  DequantizeLinear: one per row of the gathered rows is not a per-axis scale, and one of the
  whole table before the Gather would dequantise every row on every run. A position table
  an Add adds to a lookup (the exporter folded its Gather into a constant) is read whole, so
  it is read through one DequantizeLinear on axis 0;
* a kept product's weight (``Float8(kept_int8=True)``, scale records of format ``int8`` per
  ``channel``) is stored int8 with one scale per output channel (max |w| / 127 in the low type,
  rounded up, from the float32 weight) and a ``DequantizeLinear`` (axis: the weight's N axis, no
  zero point) gives the product its weight in the low type, the product itself unchanged;
* the model's opset becomes at least 21 (low-type scales need it), through ONNX's version
  converter where it is older.

A runtime then sees ``DQ -> MatMul`` groups it may fuse into a float8 GEMM (TensorRT), or
runs as dequantise + matrix product (onnxruntime), which emulates float8 exactly.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphamp.core.dtypes import numpy_type
from graphamp.core.graph import OpGraph, unique_name
from graphamp.dialects.base import ReadGraph
from graphamp.errors import GraphampError, InternalError
from graphamp.onnx.io import stream
from graphamp.onnx.io.infile import InFileTensor, StreamedModel
from graphamp.onnx.io.subgraphs import graphs
from graphamp.onnx.numerics.statgraph import node_names
from graphamp.plans.records import ScaleRecord
from graphamp.training.float8 import E4M3_MAX, scale_of

FP8_OPSET = 21  # DequantizeLinear writes its scale's type; float16/bfloat16 scales need 21
QUANTISERS = frozenset({"QuantizeLinear", "DequantizeLinear"})
INT8_MAX = 127.0  # an 8-bit table's rows are symmetric: -127..127
TABLE_BLOCK_ROWS = 4096  # rows of an embedding table quantised at a time (memory)
_E4M3 = onnx.TensorProto.FLOAT8E4M3FN


def refuse_quantised(graph: OpGraph, where: str) -> None:
    """A model that already holds quantisers is refused with float8 (its Q/DQ groups are
    today's ``qdq`` rule's, as ModelOpt leaves quantised models alone)."""
    found = next((n for n in graph if n.op in QUANTISERS and not n.domain), None)
    if found is not None:
        _refuse(where, found.op, found.name)


def refuse_quantised_file(path: str | os.PathLike[str]) -> None:
    """:func:`refuse_quantised` for a model file, read without its weights (before any
    calibration runs it)."""
    from graphamp.onnx.io import infile

    mapped = infile.read(path)
    proto = mapped.proto if mapped is not None else onnx.load(str(path), load_external_data=False)
    names = node_names(proto.graph)
    for name, node in zip(names, proto.graph.node, strict=True):
        if node.op_type in QUANTISERS and node.domain in ("", "ai.onnx"):
            _refuse(str(path), node.op_type, name)


def _refuse(where: str, op: str, node: str) -> None:
    raise GraphampError(
        f"{where}: already quantised ({op} node {node!r}): --fp8 converts float models; "
        "drop --fp8 to convert it to the low type as it is"
    )


def emit(model: Any, read: ReadGraph, scales: list[ScaleRecord], dtype: str) -> Any:
    """``model`` (what the writer made: a ModelProto, a StreamedModel or an onnx_ir model)
    with the scale records' quantisers and float8 weights (module docstring)."""
    if not scales:
        return model
    if not isinstance(model, onnx.ModelProto | StreamedModel):
        import onnx_ir as ir

        model = ir.to_proto(model)
    proto = model.proto if isinstance(model, StreamedModel) else model
    _at_least_opset(proto)
    in_file = getattr(read.model, "weights", None) or {}  # a ProtoModel's weights left on disk
    _Emitter(proto, read.graph, dtype, model, in_file).run(scales)
    return model


class _Emitter:
    def __init__(
        self,
        proto: onnx.ModelProto,
        graph: OpGraph,
        dtype: str,
        model: Any,
        in_file: dict[str, InFileTensor],
    ) -> None:
        self.proto, self.graph, self.low = proto, graph, numpy_type(dtype)
        self.model, self.in_file = model, in_file
        main = proto.graph
        self.by_name = dict(zip(node_names(main), main.node, strict=True))
        self.taken = {name for node in main.node for name in (*node.input, *node.output)}
        self.taken |= {init.name for init in main.initializer} | set(self.by_name)
        self.before: dict[int, list[onnx.NodeProto]] = {}  # node position -> nodes to put first
        self.after: dict[int, list[onnx.NodeProto]] = {}  # node position -> nodes to put next
        self.position = {id(node): index for index, node in enumerate(main.node)}

    def run(self, scales: list[ScaleRecord]) -> None:
        for record in scales:
            readers = self._readers(record)
            if record.source == "weight" and record.format == "int8":
                if record.granularity == "row":
                    self._table(record, readers)
                else:
                    self._int8_weight(record, readers)
            elif record.source == "weight":
                self._weight(record, readers)
            elif record.source == "calibration":
                self._activation(record, readers)
            else:
                raise GraphampError(
                    f"ONNX float8 takes static scales only; {record.tensor!r} has a "
                    f"{record.source} scale (use Float8.static())"
                )
        nodes = []
        for index, node in enumerate(self.proto.graph.node):
            nodes += self.before.get(index, [])
            nodes.append(node)
            nodes += self.after.get(index, [])
        del self.proto.graph.node[:]
        self.proto.graph.node.extend(nodes)
        self._drop_unread()

    def _readers(self, record: ScaleRecord) -> list[tuple[onnx.NodeProto, int]]:
        """(node, input slot) of each float8 reader of ``record``'s value in the written model
        (its slot may now read a cast or converted copy of it)."""
        readers = []
        for consumer in record.consumers:
            node = self.by_name.get(consumer)
            if node is None:
                raise InternalError(f"float8: node {consumer!r} is not in the written model")
            slots = [
                s for s, v in enumerate(self.graph.nodes[consumer].inputs) if v == record.tensor
            ]
            readers += [(node, slot) for slot in slots]
        return readers

    def _name(self, base: str) -> str:
        return unique_name(base, self.taken)

    def _insert(
        self, readers: list[tuple[onnx.NodeProto, int]], nodes: list[onnx.NodeProto]
    ) -> None:
        first = min(self.position[id(node)] for node, _ in readers)
        self.before.setdefault(first, []).extend(nodes)

    def _activation(self, record: ScaleRecord, readers: list[tuple[onnx.NodeProto, int]]) -> None:
        amax = float(_detail(record, "amax"))
        margin = int(_detail(record, "margin", 0))
        scale = stored_scales(np.array(scale_of(amax, margin), np.float32), self.low)
        value = readers[0][0].input[readers[0][1]]
        scale_name, zero_name = (
            self._name(f"{record.tensor}/fp8_scale"),
            self._name(f"{record.tensor}/fp8_zero"),
        )
        self.proto.graph.initializer.extend([
            numpy_helper.from_array(np.asarray(scale), scale_name),
            helper.make_tensor(zero_name, _E4M3, [], [0.0]),
        ])  # fmt: skip
        quantised, restored = (
            self._name(f"{record.tensor}/fp8"),
            self._name(f"{record.tensor}/fp8_dq"),
        )
        nodes = [
            helper.make_node("QuantizeLinear", [value, scale_name, zero_name], [quantised],
                             name=self._name(f"{record.tensor}/QuantizeLinear")),
            helper.make_node("DequantizeLinear", [quantised, scale_name, zero_name], [restored],
                             name=self._name(f"{record.tensor}/DequantizeLinear")),
        ]  # fmt: skip
        self._insert(readers, nodes)
        for node, slot in readers:
            node.input[slot] = restored

    def _weight(self, record: ScaleRecord, readers: list[tuple[onnx.NodeProto, int]]) -> None:
        axis = int(_detail(record, "axis", -1))
        stored, scale_name = (
            self._name(f"{record.tensor}/fp8"),
            self._name(f"{record.tensor}/fp8_scale"),
        )
        restored = self._name(f"{record.tensor}/fp8_dq")
        in_file = self.in_file.get(record.tensor)
        if in_file is not None and isinstance(self.model, StreamedModel):
            # read from where the input keeps it: once for the scales now, once more as the
            # output is written (Float8Weight), never whole in memory
            axis %= len(in_file.dims)
            scales = channel_scales(_channel_amax(in_file, axis), self.low)
            tensor = onnx.TensorProto(name=stored, data_type=_E4M3, dims=in_file.dims)
            self.model.data[len(self.proto.graph.initializer)] = Float8Weight(
                in_file, axis, scales.astype(np.float32)
            )
        else:
            values = self._stored_values(record, "float8: weight")
            axis %= values.ndim
            quantised, scales = quantise_per_channel(values, axis, self.low)
            tensor = helper.make_tensor(stored, _E4M3, values.shape, quantised.tobytes(), raw=True)
        self.proto.graph.initializer.extend([tensor, numpy_helper.from_array(scales, scale_name)])
        self._dequantised(record, readers, stored, scale_name, axis, restored)

    def _int8_weight(self, record: ScaleRecord, readers: list[tuple[onnx.NodeProto, int]]) -> None:
        """A kept product's weight stored int8 per output channel, read through one
        DequantizeLinear to the low type (module docstring)."""
        values = self._stored_values(record, "int8 weight:")
        axis = int(_detail(record, "axis", -1)) % values.ndim
        quantised, scales = quantise_channels_int8(values, axis, self.low)
        stored, scale_name = (
            self._name(f"{record.tensor}/int8"),
            self._name(f"{record.tensor}/int8_scale"),
        )
        restored = self._name(f"{record.tensor}/int8_dq")
        self.proto.graph.initializer.extend([
            numpy_helper.from_array(quantised, stored),
            numpy_helper.from_array(scales, scale_name),
        ])  # fmt: skip
        self._dequantised(record, readers, stored, scale_name, axis, restored)

    def _table(self, record: ScaleRecord, readers: list[tuple[onnx.NodeProto, int]]) -> None:
        """An embedding table stored int8 per row: each Gather reading it rewritten to gather
        the int8 rows and their scales and multiply them back; an Add reading it (a position
        table) reads it through one DequantizeLinear (module docstring)."""
        quantised, scales = quantise_rows(self._stored_values(record, "8-bit table:"), self.low)
        stored = self._name(f"{record.tensor}/int8")
        self.proto.graph.initializer.append(numpy_helper.from_array(quantised, stored))
        adds = [(node, slot) for node, slot in readers if node.op_type == "Add"]
        gathers = [(node, slot) for node, slot in readers if node.op_type != "Add"]
        if adds:
            self._position_table(record, adds, stored, scales)
        if gathers:
            self._lookups(record, gathers, stored, scales)

    def _lookups(
        self,
        record: ScaleRecord,
        gathers: list[tuple[onnx.NodeProto, int]],
        stored: str,
        scales: np.ndarray,
    ) -> None:
        """Each Gather of the int8 table ``stored`` gathers its rows, a second Gather their
        scales (a [rows, 1] vector), and Cast + Mul give the rows in the low type."""
        scale_name = self._name(f"{record.tensor}/row_scale")
        self.proto.graph.initializer.append(
            numpy_helper.from_array(scales.reshape(-1, 1), scale_name)
        )
        low_code = helper.np_dtype_to_tensor_dtype(np.dtype(self.low))
        for gather, slot in gathers:
            if slot != 0:
                raise GraphampError(f"8-bit table: {gather.name!r} reads it as its indices")
            axis = [a.i for a in gather.attribute if a.name == "axis"]
            if axis and axis[0] not in (0, -2):  # the pass decides only axis-0 lookups
                raise GraphampError(f"8-bit table: {gather.name!r} gathers axis {axis[0]}")
            output, indices = gather.output[0], gather.input[1]
            rows = self._name(f"{output}/int8")
            row_scales, widened = self._name(f"{output}/row_scale"), self._name(f"{output}/low")
            gather.input[0], gather.output[0] = stored, rows
            self.after.setdefault(self.position[id(gather)], []).extend([
                helper.make_node("Gather", [scale_name, indices], [row_scales], axis=0,
                                 name=self._name(f"{gather.name}/RowScale")),
                helper.make_node("Cast", [rows], [widened], to=low_code,
                                 name=self._name(f"{gather.name}/Cast")),
                helper.make_node("Mul", [widened, row_scales], [output],
                                 name=self._name(f"{gather.name}/Mul")),
            ])  # fmt: skip

    def _position_table(
        self,
        record: ScaleRecord,
        adds: list[tuple[onnx.NodeProto, int]],
        stored: str,
        scales: np.ndarray,
    ) -> None:
        """A position table an Add adds to an embedding lookup, read as the int8 table
        ``stored`` through one DequantizeLinear per row (axis 0): the Add reads every row, so
        the whole table is dequantised, as the Add read the whole low one before."""
        scale_name = self._name(f"{record.tensor}/row_scale")
        restored = self._name(f"{record.tensor}/int8_dq")
        self.proto.graph.initializer.append(numpy_helper.from_array(scales, scale_name))
        self._dequantised(record, adds, stored, scale_name, 0, restored)

    def _stored_values(self, record: ScaleRecord, what: str) -> np.ndarray:
        """The float32 values of the stored weight or table ``record`` quantises (``what``
        begins the error where the model holds none)."""
        info = self.graph.tensors[record.tensor]
        if info.load_value is None:
            raise GraphampError(f"{what} {record.tensor!r} has no stored value")
        return np.asarray(info.load_value(), np.float32)

    def _dequantised(
        self,
        record: ScaleRecord,
        readers: list[tuple[onnx.NodeProto, int]],
        stored: str,
        scale_name: str,
        axis: int,
        restored: str,
    ) -> None:
        """One ``DequantizeLinear`` of ``stored`` (its scales ``scale_name`` along ``axis``)
        into ``restored``, put before the first of ``readers``, each of which then reads
        ``restored`` where it read ``record``'s value."""
        node = helper.make_node(
            "DequantizeLinear", [stored, scale_name], [restored], axis=axis,
            name=self._name(f"{record.tensor}/DequantizeLinear"),
        )  # fmt: skip
        self._insert(readers, [node])
        for reader, slot in readers:
            reader.input[slot] = restored

    def _drop_unread(self) -> None:
        """Initializers no node reads any more (a weight's low copy all of whose readers now
        read its float8 one), with a StreamedModel's data positions moved to match."""
        graph = self.proto.graph
        # a branch or loop body reads the main graph's initializers too (a weight only a
        # branch's product reads is no less read)
        read = {name for body in graphs(graph) for node in body.node for name in node.input}
        read |= {value.name for value in graph.output}
        keep = [i for i, init in enumerate(graph.initializer) if init.name in read]
        if len(keep) == len(graph.initializer):
            return
        if isinstance(self.model, StreamedModel):
            moved = {old: new for new, old in enumerate(keep)}
            self.model.data = {moved[p]: d for p, d in self.model.data.items() if p in moved}
        kept = [graph.initializer[i] for i in keep]
        del graph.initializer[:]
        graph.initializer.extend(kept)


def quantise_per_channel(values: np.ndarray, axis: int, low: type) -> tuple[np.ndarray, np.ndarray]:
    """``values`` as float8_e4m3fn with one scale per index of ``axis`` (max |w| / 448 as the
    low type ``low`` holds it, see :func:`channel_scales`), and those scales. Each channel is
    divided by its stored scale, so that the stored value times the stored scale is what a
    runtime's DequantizeLinear gives, and no value passes 448."""
    moved = np.moveaxis(values, axis, 0).reshape(values.shape[axis], -1)
    amax = np.abs(moved).max(axis=1) if moved.size else np.zeros(values.shape[axis], np.float32)
    scales = channel_scales(amax, low)
    shape = [1] * values.ndim
    shape[axis] = -1
    return _to_e4m3(values / scales.astype(np.float32).reshape(shape)), scales


def quantise_rows(table: np.ndarray, low: type) -> tuple[np.ndarray, np.ndarray]:
    """A 2-D ``table`` as int8 with one scale per row: max |row| / 127 stored in the low type
    ``low`` (rounded up, :func:`stored_scales`; 1 for an all-zero row), each row divided by its
    stored scale and rounded to the nearest integer, ties to even, so that int8 value times
    stored scale is what the rewritten Gather gives and no value passes 127. Returns the int8
    table and the scales (in ``low``), a block of rows at a time (memory)."""
    quantised = np.empty(table.shape, np.int8)
    scales: np.ndarray = np.empty(table.shape[0], low)
    for start in range(0, table.shape[0], TABLE_BLOCK_ROWS):
        block = np.asarray(table[start : start + TABLE_BLOCK_ROWS], np.float32)
        amax = np.abs(block).max(axis=1, initial=0.0)
        stored = stored_scales(np.where(amax > 0, amax / INT8_MAX, 1.0).astype(np.float32), low)
        ratio = np.rint(block / stored.astype(np.float32)[:, None])
        quantised[start : start + len(block)] = np.clip(ratio, -INT8_MAX, INT8_MAX)
        scales[start : start + len(block)] = stored
    return quantised, scales


def quantise_channels_int8(
    values: np.ndarray, axis: int, low: type
) -> tuple[np.ndarray, np.ndarray]:
    """``values`` as int8 with one scale per index of ``axis``: :func:`quantise_rows` of the
    values with that axis first (max |channel| / 127 in ``low``, rounded up; rint, ties to
    even), moved back; the scales a vector, as DequantizeLinear's axis takes them."""
    moved = np.moveaxis(values, axis, 0)
    rows, scales = quantise_rows(moved.reshape(moved.shape[0], -1), low)
    return np.ascontiguousarray(np.moveaxis(rows.reshape(moved.shape), 0, axis)), scales


def channel_scales(amax: np.ndarray, low: type) -> np.ndarray:
    """One scale per channel from its largest magnitude: amax / 448 stored in the low type
    (:func:`stored_scales`), 1 for an all-zero channel."""
    amax = np.asarray(amax, np.float32)
    return stored_scales(np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32), low)


def _to_e4m3(ratio: np.ndarray) -> np.ndarray:
    """``ratio`` (float32, changed in place) clipped to +-448 and rounded to float8_e4m3fn."""
    limit = np.float32(E4M3_MAX)
    return np.clip(ratio, -limit, limit, out=ratio).astype(ml_dtypes.float8_e4m3fn)


@dataclass
class Float8Weight:
    """A weight's float8 values as a converted model's data (:class:`StreamedModel`), made a
    block at a time from ``source`` (where the input keeps the weight) when its bytes are
    asked for: as :func:`quantise_per_channel` makes them, with ``scales`` (float32, one per
    index of ``axis``), so memory holds a block, not the weight."""

    source: InFileTensor
    axis: int
    scales: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.source.size  # one byte per value

    def byte_chunks(self) -> Iterator[memoryview]:
        for block, channels in _channel_blocks(self.source, self.axis):
            yield stream.bytes_of(_to_e4m3(block / self.scales[channels]))


def _channel_amax(source: InFileTensor, axis: int) -> np.ndarray:
    """max |w| of each index of ``axis`` of the weight at ``source``, read a block at a time."""
    amax = np.zeros(source.dims[axis], np.float32)
    for block, channels in _channel_blocks(source, axis):
        if channels.shape[0] == 1:  # a channel per column
            np.maximum(amax, np.abs(block).max(axis=0, initial=0.0), out=amax)
        else:  # a channel per row
            np.maximum.at(amax, channels[:, 0], np.abs(block).max(axis=1, initial=0.0))
    return amax


def _channel_blocks(source: InFileTensor, axis: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The weight at ``source`` in file order, as float32 blocks of whole rows, each with the
    index of its channel along ``axis`` for every element: a (1, N) row of indices where the
    channel is the last axis (a block of rows of N), else a (rows, 1) column (a block of rows
    of the axes after ``axis``, each row within one channel)."""
    dims = source.dims
    count = dims[axis]
    inner = math.prod(dims[axis + 1 :])
    width = count if inner == 1 else inner
    rows_done = 0
    for block in _whole_rows(source.chunks(), width):
        rows = block.reshape(-1, width)
        if inner == 1:
            yield rows, np.arange(count)[None, :]
        else:
            index = (rows_done + np.arange(rows.shape[0])) % count
            yield rows, index[:, None]
        rows_done += rows.shape[0]


def _whole_rows(chunks: Iterator[np.ndarray], width: int) -> Iterator[np.ndarray]:
    """``chunks`` (a flat tensor a piece at a time, in a buffer the next piece reuses) as
    float32 copies holding whole rows of ``width`` values."""
    carry = np.empty(0, np.float32)
    for chunk in chunks:
        values = np.concatenate([carry, chunk]) if carry.size else chunk.astype(np.float32)
        whole = values.size - values.size % width
        if whole:
            yield values[:whole]
        carry = values[whole:].copy()
    if carry.size:
        raise GraphampError("float8: a stored weight ends inside a row")


def stored_scales(exact: np.ndarray, low: type) -> np.ndarray:
    """Positive float32 scales as the 16-bit low type ``low`` stores them: rounded up to the
    next value it holds, never down, so a channel's largest value divided by its scale stays
    within +-448 (rounding to nearest may land below the exact scale and clip it). A scale
    below the type's smallest positive value (a float16 channel with max |w| under about
    2.7e-5) becomes that value: its weights then map below 448 but keep float8's full
    precision down to 2**-6 of it, where a scale of 1 would flush them all to zero."""
    exact = np.asarray(exact, np.float32)
    stored: np.ndarray = np.array(exact.astype(low), ndmin=1)
    below = stored.astype(np.float32) < exact.reshape(stored.shape)
    bits = stored.view(np.uint16)  # positive 16-bit floats: the next larger is one more
    bits[below] += 1
    return stored.reshape(exact.shape)


def quantise(values: np.ndarray, scale: float) -> np.ndarray:
    """``values / scale`` rounded to float8_e4m3fn as QuantizeLinear does (saturating)."""
    with np.errstate(over="ignore"):  # a quotient past float32's range saturates like any
        ratio = np.array(values, np.float32) / np.float32(scale)
    return _to_e4m3(np.asarray(ratio, np.float32))


def _at_least_opset(proto: onnx.ModelProto) -> None:
    opset = next((o for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is not None and opset.version >= FP8_OPSET:
        return
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(proto, FP8_OPSET)
    except Exception as exc:  # the converter's errors are of many types
        version = opset.version if opset is not None else "none"
        raise GraphampError(
            f"float8 needs opset {FP8_OPSET} (low-type scales); the model is opset {version} "
            f"and ONNX's version converter failed: {str(exc).splitlines()[0]}"
        ) from None
    proto.CopyFrom(converted)


def _detail(
    record: ScaleRecord, key: str, default: int | None = None
) -> int | float | np.integer | np.floating:
    """The number a scale record keeps under ``key`` (``default`` where it keeps none)."""
    value = record.detail.get(key, default)
    if not isinstance(value, int | float | np.integer | np.floating):
        raise InternalError(f"scale of {record.tensor!r}: {key} is {value!r}, not a number")
    return value
