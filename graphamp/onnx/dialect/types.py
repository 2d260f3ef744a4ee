"""ONNX schema type strings in the engine's words (:mod:`graphamp.core.dtypes` names)."""

from __future__ import annotations

from graphamp.core.dtypes import UNKNOWN

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
