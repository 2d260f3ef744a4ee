"""The aten ops a module runs, recorded with the type each computes in."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

MATRIX_OPS = {"addmm", "mm", "bmm", "baddbmm", "convolution", "_convolution", "mkldnn_convolution"}


class DtypeRecorder(TorchDispatchMode):
    """Records (aten op, dtype of its first tensor argument) for every op that runs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        first = next(
            (a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None
        )
        if first is not None:
            self.calls.append((func._opname, first.dtype))
        return func(*args, **(kwargs or {}))


def matrix_dtypes(fn, *inputs) -> list[torch.dtype]:  # type: ignore[no-untyped-def]
    with torch.no_grad(), DtypeRecorder() as recorder:
        fn(*inputs)
    return [dtype for op, dtype in recorder.calls if op in MATRIX_OPS]
