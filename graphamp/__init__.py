"""graphamp: static-graph automatic mixed precision.

Give it a float32 model; it decides per operation whether it computes in float16/bfloat16 or
stays float32, places the fewest casts, keeps weights in the smaller type where safe, and
records every decision with its reason in a :class:`Plan`.

    >>> import graphamp.onnx
    >>> result = graphamp.onnx.convert("model.onnx", dtype="float16")   # doctest: +SKIP
    >>> graphamp.onnx.save(result, "model.fp16.onnx")              # doctest: +SKIP
    >>> print(result.plan.summary())                                     # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from graphamp.errors import (
    BackwardWarning,
    BodyWarning,
    DataWarning,
    Float8Warning,
    GraphampError,
    InternalError,
    KeptWarning,
    ModeWarning,
    PolicyWarning,
    RecaptureWarning,
    RepairWarning,
    SlowPrecisionWarning,
    StaticShapeWarning,
    TeardownWarning,
    UnlistedOpWarning,
)

if TYPE_CHECKING:
    from graphamp.plans.plan import Plan
    from graphamp.policy.policy import Policy
    from graphamp.training.float8 import Float8
    from graphamp.training.scaling import DynamicLossScaling, StaticLossScaling

__version__ = "0.2.0"  # pyproject.toml and CHANGELOG.md say the same
# Imported on first use: ``import graphamp.cli`` (what ``graphamp --help`` runs) must not pay
# for numpy and the plan machinery it does not use.
_LAZY = {
    "Plan": "graphamp.plans.plan",
    "Policy": "graphamp.policy.policy",
    "DynamicLossScaling": "graphamp.training.scaling",
    "Float8": "graphamp.training.float8",
    "StaticLossScaling": "graphamp.training.scaling",
}
__all__ = [
    "BackwardWarning",
    "BodyWarning",
    "DataWarning",
    "DynamicLossScaling",
    "Float8",
    "Float8Warning",
    "GraphampError",
    "InternalError",
    "KeptWarning",
    "ModeWarning",
    "Plan",
    "Policy",
    "PolicyWarning",
    "RecaptureWarning",
    "RepairWarning",
    "SlowPrecisionWarning",
    "StaticLossScaling",
    "StaticShapeWarning",
    "TeardownWarning",
    "UnlistedOpWarning",
    "__version__",
]


# Modules the README names by their 0.1 paths (``graphamp.verify.verify(...)``), which moved
# into packages by concern in 0.2; they load on first use like the names above.
_MODULES = {"verify": "graphamp.numerics.verify"}


def __getattr__(name: str) -> object:
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'graphamp' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_MODULES})
