"""Weights that stay on disk: read lazily, converted a chunk at a time, written as they go.

A model of tens of gigabytes of external data converts in memory bounded by its graph and a few
megabytes of chunks:

* :func:`map_values` gives the passes a weight's values as a fresh read-only memory map of the
  file holding them, dropped (mapping and resident pages) as soon as the range scan lets go of
  it;
* :func:`read_chunks` reads a stored tensor a chunk at a time into one reused buffer, and
  :func:`converted_chunks` rounds such chunks to the new type as they come (what the writers
  stream to disk; an in-memory model rounds the same chunks into one array, so both give the
  same bytes).

The reader and writer use these on the weights a model file or its external data holds
(:mod:`graphamp.onnx.io.infile`).

Rounding float32 to float16 is done by onnxruntime's Cast kernel (F16C instructions) when the
chunk holds no NaN: numpy rounds in software, slower than the disk delivers the bytes. The two agree
bit for bit on every one of the 2**32 float32 values except NaN payloads, so NaN chunks and all
other conversions go through numpy (bfloat16 through ml_dtypes, which is fast).
"""

from __future__ import annotations

import functools
import mmap
import os
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from graphamp.errors import WeightOverflow
from graphamp.passes.numerics import (
    FLOAT32_LIMIT,
    at_limit_count,
    convert_values,
    overflow_threshold,
    to_target_limit,
)
from graphamp.plans.records import WeightRecord

CHUNK_ELEMENTS = 1 << 20  # 4 MiB of float32 per read: large enough for the disk, fits a cache
FAST_CAST_MIN = 1 << 16  # below this many elements numpy's own cast is as quick


class CacheBudget:
    """How much of the scanned external data stays in the page cache for the conversion to
    read again: the first ``limit`` bytes scanned (three quarters of the memory available when
    it is made). Each weight scanned beyond that is dropped from the cache once the scan has
    moved on, so it cannot push out the weights that come first: a model larger than memory is
    then read twice only in its part beyond ``limit`` (reading front to back through an LRU
    cache smaller than the file would otherwise find none of it cached). The conversion drops
    each weight once it has read it (:func:`chunks`)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = _most_of_available() if limit is None else limit
        self.kept = 0
        self._drop: list[tuple[str, int, int]] = []

    def scanning(self, path: str, offset: int, length: int) -> None:
        """A weight is about to be scanned (the previous scan is over)."""
        for earlier in self._drop:
            drop_cached(*earlier)
        self._drop.clear()
        if self.kept + length <= self.limit:
            self.kept += length
        else:
            self._drop.append((path, offset, length))


def _most_of_available() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 * 3 // 4
    except OSError:
        pass
    return 1 << 62  # unknown: keep everything, as the kernel would


def drop_cached(path: str, offset: int, length: int) -> None:
    """Ask the kernel to drop a range of a file from the page cache (clean pages only)."""
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def map_values(
    path: str, offset: int, dtype: np.dtype, shape: tuple[int, ...], budget: CacheBudget | None
) -> np.ndarray:
    """The values stored at ``offset`` of the file at ``path`` as a new read-only memory map
    (nothing is read until touched; the array holds the only reference to the map, so dropping
    it unmaps the file and its resident pages)."""
    return _map(path, offset, dtype, shape, budget or CacheBudget(1 << 62))


def _map(
    path: str, offset: int, dtype: np.dtype, shape: tuple[int, ...], budget: CacheBudget
) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64))
    length = count * np.dtype(dtype).itemsize
    budget.scanning(path, offset, length)
    start = offset - offset % mmap.ALLOCATIONGRANULARITY  # mmap offsets must be aligned
    with open(path, "rb") as file:
        mapped = mmap.mmap(
            file.fileno(), offset - start + length, access=mmap.ACCESS_READ, offset=start
        )
    # Read once, front to back: a large readahead window, pages not kept as recently used.
    if hasattr(mapped, "madvise"):
        mapped.madvise(mmap.MADV_SEQUENTIAL)
    # The array holds the only reference to the map: dropping it unmaps the file.
    values = np.frombuffer(mapped, np.dtype(dtype).newbyteorder("<"), count, offset - start)
    return values.reshape(shape)


def read_chunks(
    path: str,
    offset: int,
    dtype: np.dtype,
    total: int,
    size: int = CHUNK_ELEMENTS,
    *,
    drop: bool = True,
) -> Iterator[np.ndarray]:
    """The ``total`` values of ``dtype`` stored at ``offset`` of ``path``, ``size`` at a time,
    read with ``pread`` into one reused buffer: no chunk outlives the next call, nothing is
    mapped. With ``drop``, the range leaves the page cache once read (a model's external data
    is read once, and may be larger than memory)."""
    return _read_chunks(path, offset, np.dtype(dtype).newbyteorder("<"), total, size, drop)


def _read_chunks(
    path: str, offset: int, dtype: np.dtype, total: int, size: int, drop: bool
) -> Iterator[np.ndarray]:
    buffer = np.empty(min(size, total), dtype)
    view = bytes_of(buffer)
    fd = os.open(path, os.O_RDONLY)
    try:
        for start in range(0, total, size):
            count = min(size, total - start)
            wanted = count * dtype.itemsize
            got = 0
            while got < wanted:  # pread may return less than asked (signals, large reads)
                n = os.preadv(fd, [view[got:wanted]], offset + start * dtype.itemsize + got)
                if n == 0:
                    raise OSError(f"{path}: the file ends before the tensor does")
                got += n
            yield buffer[:count]
    finally:
        os.close(fd)
        if drop:  # read for the last time: leave the cache to what is still to come
            drop_cached(path, offset, total * dtype.itemsize)


def array_chunks(values: np.ndarray, size: int = CHUNK_ELEMENTS) -> Iterator[np.ndarray]:
    """An in-memory array flattened, ``size`` elements at a time (as :func:`read_chunks`)."""
    flat = np.asarray(values).reshape(-1)
    for start in range(0, flat.size, size):
        yield flat[start : start + size]


def bytes_of(values: np.ndarray) -> memoryview:
    """The bytes of a contiguous array as a buffer (bfloat16 has no buffer format of its own)."""
    return values.reshape(-1).view(np.uint8).data


def convert_chunk(values: np.ndarray, dst: str, name: str) -> np.ndarray:
    """``values`` rounded to ``dst``; an overflow is a bug (classify keeps such weights'
    readers float32) or a speculation that missed, and raises WeightOverflow rather than clamp
    silently. Values at float32's limit go to ``dst``'s
    (:func:`~graphamp.passes.numerics.to_target_limit`; the plan counts them)."""
    return convert_counted(values, dst, name)[0]


def convert_counted(values: np.ndarray, dst: str, name: str) -> tuple[np.ndarray, int, int]:
    """:func:`convert_chunk`, with the counts a plan reports: (values, how many non-zero
    values became zero, how many were at float32's limit)."""
    largest = max(float(values.max()), -float(values.min())) if values.size else 0.0
    at_limit = 0
    if not largest < FLOAT32_LIMIT:  # at the limit (or NaN: max hides the limit behind it)
        at_limit = at_limit_count(values)
        values = to_target_limit(values, dst)
        largest = max(float(values.max()), -float(values.min()))
    fast = _fast_cast() if dst == "float16" and values.dtype == np.float32 else None
    # the fast path only where there is no NaN (whose payload Cast rounds differently), no inf
    if fast is not None and values.size >= FAST_CAST_MIN and np.isfinite(largest):
        if largest >= overflow_threshold(dst):
            raise WeightOverflow(name, dst)
        converted = fast(values)
        return converted, _flushed(values, converted), at_limit
    result = convert_values(values, dst)
    if result.overflowed:
        raise WeightOverflow(name, dst)
    return result.values, result.flushed_to_zero, at_limit


def _flushed(values: np.ndarray, converted: np.ndarray) -> int:
    """Non-zero ``values`` that are zero in the 16-bit ``converted``: its zeros (sign bit
    aside) counted on the half-size result, the input's zeros only when there are some."""
    zeros = int(np.count_nonzero((converted.view(np.uint16) & 0x7FFF) == 0))
    return zeros - int(np.count_nonzero(values == 0)) if zeros else 0


@functools.cache
def _fast_cast() -> Callable[[np.ndarray], np.ndarray] | None:
    """onnxruntime's float32 -> float16 Cast on one thread, or None without onnxruntime."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:  # pragma: no cover - onnxruntime is a dependency
        return None
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16)],
        "cast",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(
            model.SerializeToString(),
            options,
            providers=["CPUExecutionProvider"],
        )
    except Exception:  # pragma: no cover - a broken onnxruntime install: numpy still works
        return None
    return lambda values: session.run(None, {"x": values})[0]


def converted_chunks(
    source: Iterable[np.ndarray], dst: str, name: str, record: WeightRecord | None = None
) -> Iterator[np.ndarray]:
    """The chunks of ``source`` rounded to ``dst`` (each valid until the next). A complete pass
    writes what it counted (values flushed to zero, values at float32's limit) into ``record``,
    the plan's entry for the weight: where the range check was left to the conversion
    (WeightRanges ``speculate``) these counts exist only from here. ``name`` names the weight
    in an overflow's error."""
    flushed = at_limit = 0
    for chunk in source:
        converted, chunk_flushed, chunk_at_limit = convert_counted(chunk, dst, name)
        flushed += chunk_flushed
        at_limit += chunk_at_limit
        yield converted
    if record is not None:
        record.flushed_to_zero = flushed
        record.at_limit = at_limit
