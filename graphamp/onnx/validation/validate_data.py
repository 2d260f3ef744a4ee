"""Stored tensors of a model from a stranger, checked from their metadata alone.

A tensor's data must be exactly what its dims and type need, wherever it is: ``raw_data``
(bytes), a typed field (``float_data``, ``int32_data``, ...) or an external file. External data
must lie inside the model's folder, symlinks resolved, and be long enough; nothing outside that
folder is ever opened. Sizes are computed with Python integers, so dims whose product overflows
64 bits are refused, not wrapped. Nothing here copies weight data except ``raw_data``'s length,
which protobuf only hands over as a copy (transient, one tensor at a time).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import onnx

from graphamp.errors import GraphampError

T = onnx.TensorProto
# Bits one element takes in raw_data; the sub-byte types are packed.
_BITS: dict[int, int] = {
    T.FLOAT: 32, T.UINT8: 8, T.INT8: 8, T.UINT16: 16, T.INT16: 16, T.INT32: 32, T.INT64: 64,
    T.BOOL: 8, T.FLOAT16: 16, T.DOUBLE: 64, T.UINT32: 32, T.UINT64: 64, T.COMPLEX64: 64,
    T.COMPLEX128: 128, T.BFLOAT16: 16, T.FLOAT8E4M3FN: 8, T.FLOAT8E4M3FNUZ: 8, T.FLOAT8E5M2: 8,
    T.FLOAT8E5M2FNUZ: 8, T.UINT4: 4, T.INT4: 4, T.FLOAT4E2M1: 4,
}  # fmt: skip
for _name, _bits in (("FLOAT8E8M0", 8), ("UINT2", 2), ("INT2", 2), ("FLOAT6E2M3", 6),
                     ("FLOAT6E3M2", 6)):  # fmt: skip
    if hasattr(T, _name):  # newer onnx releases only
        _BITS[getattr(T, _name)] = _bits
KNOWN_TYPES = frozenset(_BITS) | {T.STRING}
# Values per element in the typed field; 4- and 2-bit types pack 2 and 4 elements per entry.
_PER_ENTRY: dict[int, int] = {T.UINT4: 2, T.INT4: 2, T.FLOAT4E2M1: 2}
for _name in ("UINT2", "INT2"):
    if hasattr(T, _name):
        _PER_ENTRY[getattr(T, _name)] = 4
_ENTRIES_PER_ELEMENT: dict[int, int] = {T.COMPLEX64: 2, T.COMPLEX128: 2}
# No dims may multiply to more elements than this (2**62 bytes of float32 is no model).
_MAX_ELEMENTS = 2**60


def type_name(code: int) -> str:
    return T.DataType.Name(code) if code in T.DataType.values() else f"type code {code}"


# numpy (and so every runtime here) holds at most 64 dimensions
MAX_RANK = 64


def check_tensor(
    tensor: onnx.TensorProto, where: str, base_dir: Path | None, raw_bytes: int | None = None
) -> None:
    """Data as long as dims and type need, in one place; external data inside ``base_dir``.
    ``raw_bytes``: the length of raw_data that was left in the file
    (:mod:`graphamp.onnx.io.infile`), for a tensor that holds it no more."""
    if tensor.data_type not in KNOWN_TYPES:
        raise GraphampError(f"{where}: has no ONNX element type ({type_name(tensor.data_type)})")
    if any(d < 0 for d in tensor.dims):
        raise GraphampError(f"{where}: negative dimension in {list(tensor.dims)}")
    if len(tensor.dims) > MAX_RANK:
        raise GraphampError(f"{where}: {len(tensor.dims)} dimensions (at most {MAX_RANK})")
    elements = math.prod(tensor.dims)  # Python integers: no overflow
    if elements > _MAX_ELEMENTS:
        raise GraphampError(f"{where}: dims {list(tensor.dims)} hold {elements} elements")
    if tensor.data_location == T.EXTERNAL:
        needed = _raw_bytes(tensor.data_type, elements)
        _check_external(tensor, where, base_dir, needed or 0)
        return
    if raw_bytes is not None or tensor.HasField("raw_data"):
        held = len(tensor.raw_data) if raw_bytes is None else raw_bytes
        needed = _raw_bytes(tensor.data_type, elements)
        if needed is not None and held != needed:
            raise GraphampError(
                f"{where}: raw_data holds {held} bytes; dims "
                f"{list(tensor.dims)} of {type_name(tensor.data_type)} need {needed}"
            )
        return
    field = onnx.helper.tensor_dtype_to_field(tensor.data_type)
    held = len(getattr(tensor, field))  # a repeated field's length: no copy
    needed = _typed_entries(tensor.data_type, elements)
    if held != needed:
        raise GraphampError(
            f"{where}: {field} holds {held} value(s); dims {list(tensor.dims)} of "
            f"{type_name(tensor.data_type)} need "
            f"{needed}" + (" (the tensor has no data)" if held == 0 else "")
        )


def _raw_bytes(code: int, elements: int) -> int | None:
    """Bytes of raw data ``elements`` of type ``code`` take (None: strings have no raw form)."""
    bits = _BITS.get(code)
    return None if bits is None else (elements * bits + 7) // 8


def _typed_entries(code: int, elements: int) -> int:
    per_entry = _PER_ENTRY.get(code)
    if per_entry is not None:
        return (elements + per_entry - 1) // per_entry
    return elements * _ENTRIES_PER_ELEMENT.get(code, 1)


def _check_external(
    tensor: onnx.TensorProto, where: str, base_dir: Path | None, needed: int
) -> None:
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location")
    if not location:
        raise GraphampError(f"{where}: external data without a location")
    if base_dir is None:
        raise GraphampError(
            f"{where}: external data {location!r} but no folder to read it from (load the model "
            "from its file)"
        )
    try:
        folder = Path(os.path.realpath(base_dir))
        path = Path(os.path.realpath(folder / location))
        inside = folder == path or folder in path.parents
        # the path as the runtime opens it, too: "sub/../w.bin" needs a folder "sub"
        opened = os.path.isfile(os.path.join(base_dir, location))
        size = path.stat().st_size if inside and opened and path.is_file() else None
    except (OSError, ValueError):  # a NUL byte, a name too long, a symlink loop
        raise GraphampError(
            f"{where}: external data location {location!r} is no usable path"
        ) from None
    if not inside:
        raise GraphampError(
            f"{where}: external data {location!r} points outside the model's folder; "
            "graphamp reads nothing there"
        )
    if size is None:
        raise GraphampError(f"{where}: external data file {location!r} is missing")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else needed
    except ValueError:
        raise GraphampError(f"{where}: external data offset or length is not a number") from None
    if offset < 0 or length < 0 or offset + length > size:
        raise GraphampError(
            f"{where}: external data {location!r} is {size} bytes; the tensor "
            f"needs bytes {offset} to {offset + length}"
        )
    if needed and length != needed:
        raise GraphampError(
            f"{where}: external data holds {length} bytes; the tensor's dims need {needed}"
        )
