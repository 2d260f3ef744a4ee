"""graphamp: static-graph automatic mixed precision.

Give it a float32 model; it decides per operation whether it computes in float16/bfloat16 or
stays float32, places the fewest casts, keeps weights in the smaller type where safe, and
records every decision with its reason in a :class:`Plan`.

    >>> import graphamp.onnx
    >>> result = graphamp.onnx.convert("model.onnx", dtype="float16")   # doctest: +SKIP
    >>> graphamp.onnx.save(result.model, "model.fp16.onnx")              # doctest: +SKIP
    >>> print(result.plan.summary())                                     # doctest: +SKIP
"""

from graphamp.errors import (
    GraphampError,
    InternalError,
    PolicyWarning,
    RecaptureWarning,
    SlowPrecisionWarning,
)
from graphamp.plan import Plan
from graphamp.policy import Policy
from graphamp.scaling import DynamicLossScaling, StaticLossScaling

__version__ = "0.1.0"
__all__ = [
    "DynamicLossScaling",
    "GraphampError",
    "InternalError",
    "Plan",
    "Policy",
    "PolicyWarning",
    "RecaptureWarning",
    "SlowPrecisionWarning",
    "StaticLossScaling",
    "__version__",
]
