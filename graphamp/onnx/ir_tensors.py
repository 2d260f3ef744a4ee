"""onnx_ir tensors that stay on disk until written (the onnx_ir path's side of
:mod:`graphamp.onnx.stream`).

* :func:`loader` gives the passes a weight's values without keeping them: external data as a
  fresh memory map on each call;
* :class:`ConvertedTensor` is a weight rounded to its new type *when its bytes are asked for*:
  ``tofile`` (what ``onnx_ir.save`` calls for external data) reads, rounds and writes one chunk
  at a time; ``numpy``/``tobytes`` (an in-memory model, ``to_proto``) round the same chunks into
  one array, so both give the same bytes;
* :func:`stored_bytes` is a tensor's bytes as a data file stores them, a chunk at a time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import onnx_ir as ir

from graphamp.core import dtypes
from graphamp.onnx import stream
from graphamp.plans.records import WeightRecord


def loader(
    tensor: ir.TensorProtocol, budget: stream.CacheBudget | None = None
) -> Callable[[], np.ndarray]:
    """A function returning ``tensor``'s values without keeping them: external data comes as a
    new read-only memory map on each call (nothing is read until it is touched, and the pages go
    with the array), anything else as the tensor's own array."""
    if isinstance(tensor, ir.ExternalTensor) and _plain_numpy(tensor.dtype) and tensor.size:
        return functools.partial(
            stream.map_values,
            tensor.path,
            tensor.offset or 0,
            tensor.dtype.numpy(),
            tuple(tensor.shape),
            budget,
        )
    return tensor.numpy


def _plain_numpy(dtype: ir.DataType) -> bool:
    """Types stored one whole byte-aligned element at a time (not 2/4/6-bit packed)."""
    return dtype.bitwidth % 8 == 0 and dtype not in (ir.DataType.STRING, ir.DataType.UNDEFINED)


def chunks(tensor: ir.TensorProtocol, size: int = stream.CHUNK_ELEMENTS) -> Iterator[np.ndarray]:
    """``tensor``'s values flattened, ``size`` elements at a time. External data is read with
    ``pread`` into one reused buffer (and dropped from the page cache once read)."""
    if isinstance(tensor, ir.ExternalTensor) and _plain_numpy(tensor.dtype):
        return stream.read_chunks(
            tensor.path, tensor.offset or 0, tensor.dtype.numpy(), tensor.size, size
        )
    return stream.array_chunks(tensor.numpy(), size)


def stored_bytes(tensor: ir.TensorProtocol) -> Iterator[memoryview | bytes]:
    """``tensor``'s bytes as stored in a data file, a chunk at a time where it can be: a
    converted weight rounds chunk by chunk, external data is read chunk by chunk."""
    if isinstance(tensor, ConvertedTensor):
        for converted in tensor.converted_chunks():
            yield stream.bytes_of(converted)
    elif isinstance(tensor, ir.ExternalTensor) and _plain_numpy(tensor.dtype):
        for chunk in chunks(tensor):
            yield stream.bytes_of(chunk)
    else:
        yield tensor.tobytes()


class ConvertedTensor(ir.LazyTensor):
    """``source`` rounded to ``dst`` (an engine dtype name), computed when read.

    ``tofile`` streams chunk by chunk (what saving with external data calls); ``numpy`` and
    ``tobytes`` build the whole array from the same chunks. Nothing is cached. Each complete
    pass writes its counts into ``record`` (:func:`graphamp.onnx.stream.converted_chunks`).
    """

    __slots__ = ("_dst", "_record", "_source")

    def __init__(
        self, source: ir.TensorProtocol, dst: str, name: str, record: WeightRecord | None = None
    ) -> None:
        shape = ir.Shape(tuple(source.shape))
        dtype = ir.DataType(dtypes.BY_NAME[dst].onnx)
        super().__init__(lambda: ir.Tensor(self.numpy()), dtype, shape, name=name)
        self._source = source
        self._dst = dst
        self._record = record

    @property
    def source(self) -> ir.TensorProtocol:
        """The tensor this one is converted from."""
        return self._source

    def converted_chunks(self) -> Iterator[np.ndarray]:
        """The converted values, flattened, a chunk at a time (each valid until the next)."""
        name = self._record.name if self._record is not None else str(self.name)
        return stream.converted_chunks(chunks(self._source), self._dst, name, self._record)

    def numpy(self) -> np.ndarray:
        out = np.empty(self.size, dtypes.numpy_type(self._dst))
        start = 0
        for converted in self.converted_chunks():
            out[start : start + converted.size] = converted
            start += converted.size
        return out.reshape(self.shape.numpy())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        values = self.numpy()
        return values if dtype is None else values.astype(dtype)

    def tobytes(self) -> bytes:
        return self.numpy().tobytes()

    def tofile(self, file: Any) -> None:
        for converted in self.converted_chunks():
            file.write(stream.bytes_of(converted))

    def __repr__(self) -> str:
        return f"{self._repr_base()}(name={self.name!r}, source={self._source!r})"
