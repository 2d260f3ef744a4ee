"""The one dtype table: each element type's name, numpy type, ONNX code and torch name.

Names are the engine's words for types (``"float32"``, ``"bfloat16"``, ``"int64"``); each
dialect maps its own type objects through this table. ONNX codes are the ``TensorProto``
element types (stable numbers, so this module imports neither onnx nor torch).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from graphamp.core.vocab import TARGET_TYPES as TARGET_TYPES  # re-exported: the table's words

UNKNOWN = "unknown"


@dataclass(frozen=True)
class DType:
    name: str
    numpy: type  # numpy scalar type (bfloat16 from ml_dtypes, which rounds to nearest even)
    onnx: int  # onnx.TensorProto element type
    torch: str | None  # attribute of the torch module, None where torch has no such type
    is_float: bool = False


TABLE: tuple[DType, ...] = (
    DType("float32", np.float32, 1, "float32", True),
    DType("float16", np.float16, 10, "float16", True),
    DType("bfloat16", ml_dtypes.bfloat16, 16, "bfloat16", True),
    DType("float64", np.float64, 11, "float64", True),
    DType("uint8", np.uint8, 2, "uint8"),
    DType("int8", np.int8, 3, "int8"),
    DType("uint16", np.uint16, 4, "uint16"),
    DType("int16", np.int16, 5, "int16"),
    DType("int32", np.int32, 6, "int32"),
    DType("int64", np.int64, 7, "int64"),
    DType("string", np.object_, 8, None),
    DType("bool", np.bool_, 9, "bool"),
    DType("uint32", np.uint32, 12, "uint32"),
    DType("uint64", np.uint64, 13, "uint64"),
    DType("complex64", np.complex64, 14, "complex64"),
    DType("complex128", np.complex128, 15, "complex128"),
    # float8 (the float8 tier's stored weights and quantised values): no float math of the
    # passes' own runs on them, so they count as no float type here
    DType("float8_e4m3fn", ml_dtypes.float8_e4m3fn, 17, "float8_e4m3fn"),
    DType("float8_e5m2", ml_dtypes.float8_e5m2, 19, "float8_e5m2"),
)

BY_NAME: dict[str, DType] = {entry.name: entry for entry in TABLE}
BY_ONNX: dict[int, DType] = {entry.onnx: entry for entry in TABLE}

FLOAT_TYPES = frozenset(entry.name for entry in TABLE if entry.is_float)
LOW_TYPES = frozenset({"float16", "bfloat16"})


def numpy_type(name: str) -> type:
    """The numpy scalar type of ``name`` (KeyError for a type numpy cannot hold)."""
    return BY_NAME[name].numpy


@functools.cache  # (asked once per Cast and weight: np.dtype costs more than the lookup)
def itemsize(name: str) -> int:
    return int(np.dtype(numpy_type(name)).itemsize)


# What a symbolic dimension counts in the estimates of bytes moved (the plan's Cast bytes, the
# cost pass's cut): 1, as for batch 1 and one token, so the weights weigh against one token's
# activations.
SYMBOLIC_DIM = 1


def estimated_elements(shape: tuple[object, ...] | None) -> int | None:
    """The element count of ``shape``, a symbolic dimension counted :data:`SYMBOLIC_DIM`;
    None when the rank is unknown."""
    if shape is None:
        return None
    count = 1
    for dim in shape:
        count *= dim if isinstance(dim, int) and dim >= 0 else SYMBOLIC_DIM
    return count


def cast_bytes(shape: tuple[object, ...] | None, src: str, dst: str) -> int | None:
    """The bytes a Cast of a value of ``shape`` from ``src`` to ``dst`` reads and writes per
    run (estimated: :func:`estimated_elements`); None when the rank is unknown."""
    count = estimated_elements(shape)
    return None if count is None else count * (itemsize(src) + itemsize(dst))


def from_onnx(code: int) -> str | None:
    """The name of an ONNX element type, or None for one outside the table."""
    entry = BY_ONNX.get(code)
    return entry.name if entry else None


def from_numpy(dtype: np.dtype) -> str:
    for entry in TABLE:
        if np.dtype(entry.numpy) == dtype:
            return entry.name
    return str(dtype)
