"""torch dtypes in the engine's words (through the one table, :mod:`graphamp.core.dtypes`)."""

from __future__ import annotations

import torch

from graphamp.core import dtypes
from graphamp.core.dtypes import UNKNOWN

_NAMES: dict[torch.dtype, str] = {
    getattr(torch, entry.torch): entry.name for entry in dtypes.TABLE if entry.torch
}


def dtype_name(dtype: object) -> str:
    """The engine's name of a torch dtype ("unknown" for anything that is not one)."""
    if isinstance(dtype, torch.dtype):
        return _NAMES.get(dtype) or str(dtype).removeprefix("torch.")
    return UNKNOWN


def torch_dtype(name: str) -> torch.dtype:
    entry = dtypes.BY_NAME[name]
    if entry.torch is None:
        raise KeyError(name)
    return getattr(torch, entry.torch)
