"""graphamp: static-graph automatic mixed precision.

Give it a float32 model; it decides per operation whether it computes in float16/bfloat16 or
stays float32, places the fewest casts, keeps weights in the smaller type where safe, and
records every decision with its reason in a :class:`Plan`.

    >>> import graphamp.onnx
    >>> result = graphamp.onnx.convert("model.onnx", dtype="float16")   # doctest: +SKIP
    >>> graphamp.onnx.save(result.model, "model.fp16.onnx")              # doctest: +SKIP
    >>> print(result.plan.summary())                                     # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from graphamp.errors import (
    GraphampError,
    InternalError,
    PolicyWarning,
    RecaptureWarning,
    RepairWarning,
    SlowPrecisionWarning,
    StaticShapeWarning,
    TeardownWarning,
)

if TYPE_CHECKING:
    from graphamp.plan import Plan
    from graphamp.policy import Policy
    from graphamp.scaling import DynamicLossScaling, StaticLossScaling

__version__ = "0.2.0"  # pyproject.toml and CHANGELOG.md say the same
# Imported on first use: ``import graphamp.cli`` (what ``graphamp --help`` runs) must not pay
# for numpy and the plan machinery it does not use.
_LAZY = {
    "Plan": "graphamp.plan",
    "Policy": "graphamp.policy",
    "DynamicLossScaling": "graphamp.scaling",
    "StaticLossScaling": "graphamp.scaling",
}
__all__ = [
    "DynamicLossScaling",
    "GraphampError",
    "InternalError",
    "Plan",
    "Policy",
    "PolicyWarning",
    "RecaptureWarning",
    "RepairWarning",
    "SlowPrecisionWarning",
    "StaticLossScaling",
    "StaticShapeWarning",
    "TeardownWarning",
    "__version__",
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'graphamp' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
