"""ONNX element types in the engine's words (through the one table, :mod:`graphamp.core.dtypes`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphamp.core import dtypes
from graphamp.core.dtypes import UNKNOWN

if TYPE_CHECKING:  # the direct path imports this module and never onnx_ir
    import onnx_ir as ir


def dtype_name(dtype: ir.DataType | None) -> str:
    """The engine's name of an ONNX element type ("unknown" for None)."""
    if dtype is None:
        return UNKNOWN
    return dtypes.from_onnx(int(dtype)) or dtype.name.lower()


def ir_type(name: str) -> ir.DataType:
    """The ONNX element type of an engine dtype name (or of one outside the table, by the
    name :func:`dtype_name` gave it: ``float8e4m3fn``)."""
    import onnx_ir as ir

    if name in dtypes.BY_NAME:
        return ir.DataType(dtypes.BY_NAME[name].onnx)
    return ir.DataType[name.upper()]


# the schemas' type names that are not the dtype table's
_SCHEMA_NAMES = {
    "float": "float32",
    "double": "float64",
    "float8e4m3fn": "float8_e4m3fn",
    "float8e5m2": "float8_e5m2",
}


def type_str_dtype(type_str: str) -> str:
    """The dtype a schema's type string names (``tensor(float)`` -> ``float32``)."""
    if type_str.startswith("tensor(") and type_str.endswith(")"):
        inner = type_str[7:-1]
        return _SCHEMA_NAMES.get(inner, inner)
    return UNKNOWN
