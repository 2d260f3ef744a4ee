"""graphamp: static-graph automatic mixed precision.

Give it a float32 model; it decides per operation whether it computes in float16/bfloat16 or
stays float32, places the fewest casts, keeps weights in the smaller type where safe, and
records every decision with its reason in a :class:`Plan`.

    >>> import graphamp.onnx
    >>> result = graphamp.onnx.convert("model.onnx", dtype="float16")   # doctest: +SKIP
    >>> graphamp.onnx.save(result.model, "model.fp16.onnx")              # doctest: +SKIP
    >>> print(result.plan.summary())                                     # doctest: +SKIP
"""

from graphamp.errors import GraphampError, SlowPrecisionWarning
from graphamp.plan import Plan
from graphamp.policy import Policy

__version__ = "0.1.0"
__all__ = [
    "DynamicLossScaling",
    "GraphampError",
    "Plan",
    "Policy",
    "SlowPrecisionWarning",
    "StaticLossScaling",
    "__version__",
]


def __getattr__(name: str) -> object:
    # The loss-scaling classes need torch; importing graphamp for ONNX work must not.
    if name in ("DynamicLossScaling", "StaticLossScaling"):
        from graphamp import training

        return getattr(training, name)
    raise AttributeError(f"module 'graphamp' has no attribute {name!r}")
