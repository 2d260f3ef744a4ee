"""graphamp's op knowledge as data: the default op lists (``<dialect>_<dtype>.toml``), the
kernels onnxruntime has (``onnxruntime_kernels.tsv``) and each op vocabulary's matrix ops
(``matrix_ops.toml``). Each is read by the code that owns it; the matrix ops, which a plan's
summary needs without importing its dialect, are read here."""

from __future__ import annotations

import functools
import tomllib
from importlib import resources

from graphamp.errors import InternalError


@functools.cache
def matrix_ops(vocabulary: str) -> frozenset[str]:
    """The op types of ``vocabulary`` ("onnx": ONNX's; "aten": PyTorch graphs') that do matrix
    work (``matrix_ops.toml``)."""
    text = resources.files(__name__).joinpath("matrix_ops.toml").read_text(encoding="utf-8")
    table = tomllib.loads(text)
    if vocabulary not in table:
        raise InternalError(f"matrix_ops.toml has no table for {vocabulary!r}")
    return frozenset(table[vocabulary]["ops"])
