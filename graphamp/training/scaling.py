"""Loss scaling: the settings a training step's loss-scaling passes read.

These are plain settings (no torch at import): the passes put them into the step graph's
nodes, and :meth:`DynamicLossScaling.update` is the rule a SCALE_UPDATE node computes, written
in tensor operations (torch tensors in, torch tensors out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from graphamp.errors import GraphampError


@dataclass(frozen=True)
class DynamicLossScaling:
    """Paddle's dynamic loss scaling (``update_loss_scaling``), as tensor operations.

    After a step with non-finite gradients: good = 0, bad += 1, and when bad reaches
    ``decr_every_n_nan_or_inf`` the scale becomes max(scale * decr_ratio, min_scale) and
    bad = 0. After a finite step: bad = 0, good += 1, and when good reaches
    ``incr_every_n_steps`` the scale is multiplied by ``incr_ratio`` (kept only if finite) and
    good = 0. Paddle floors the scale at 1; ``torch_defaults()`` is GradScaler's behaviour.
    """

    init_loss_scaling: float = 2.0**15
    incr_every_n_steps: int = 1000
    decr_every_n_nan_or_inf: int = 2
    incr_ratio: float = 2.0
    decr_ratio: float = 0.8
    min_loss_scaling: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.init_loss_scaling) and self.init_loss_scaling > 0):
            raise GraphampError(
                "DynamicLossScaling: init_loss_scaling must be finite and > 0, got "
                f"{self.init_loss_scaling} (a scale of 0 makes every gradient 0)"
            )
        if not self.incr_ratio > 1:
            raise GraphampError(
                f"DynamicLossScaling: incr_ratio must be > 1, got {self.incr_ratio}"
            )
        if not 0 < self.decr_ratio < 1:
            raise GraphampError(
                f"DynamicLossScaling: decr_ratio must be in (0, 1), got {self.decr_ratio}"
            )
        if self.incr_every_n_steps < 1 or self.decr_every_n_nan_or_inf < 1:
            raise GraphampError("DynamicLossScaling: step counts must be at least 1")

    @classmethod
    def torch_defaults(cls) -> DynamicLossScaling:
        """torch.amp.GradScaler's defaults and behaviour: 2**16, x2 after 2000 finite steps,
        x0.5 after every non-finite step, no floor."""
        return cls(
            init_loss_scaling=2.0**16,
            incr_every_n_steps=2000,
            decr_every_n_nan_or_inf=1,
            incr_ratio=2.0,
            decr_ratio=0.5,
            min_loss_scaling=0.0,
        )

    @property
    def initial_scale(self) -> float:
        return float(self.init_loss_scaling)

    def describe(self) -> str:
        return (
            f"dynamic loss scaling from {self.init_loss_scaling:g}: x{self.incr_ratio:g} after "
            f"{self.incr_every_n_steps} finite steps, x{self.decr_ratio:g} (not below "
            f"{self.min_loss_scaling:g}) after {self.decr_every_n_nan_or_inf} non-finite steps"
        )

    def initial_state(self) -> dict[str, Any]:
        """The scale state as tensors (float32 scale, int32 counters)."""
        import torch

        return {
            "scale": torch.tensor(self.init_loss_scaling, dtype=torch.float32),
            "good": torch.tensor(0, dtype=torch.int32),
            "bad": torch.tensor(0, dtype=torch.int32),
        }

    def update(self, state: dict[str, Any], found_inf: Any) -> dict[str, Any]:
        """The next (scale, good, bad) after a step; ``found_inf`` is a 0-d bool tensor."""
        import torch

        scale, good, bad = state["scale"], state["good"], state["bad"]
        zero = torch.zeros_like(good)
        bad = torch.where(found_inf, bad + 1, zero)
        good = torch.where(found_inf, zero, good + 1)
        decrease = found_inf & (bad == self.decr_every_n_nan_or_inf)
        increase = ~found_inf & (good == self.incr_every_n_steps)
        lowered = torch.clamp(scale * self.decr_ratio, min=self.min_loss_scaling)
        grown = scale * self.incr_ratio
        grown = torch.where(torch.isfinite(grown), grown, scale)
        scale = torch.where(decrease, lowered, torch.where(increase, grown, scale))
        return {
            "scale": scale,
            "good": torch.where(increase, zero, good),
            "bad": torch.where(decrease, zero, bad),
        }


@dataclass(frozen=True)
class StaticLossScaling:
    """A fixed loss scale; non-finite steps are still skipped."""

    scale: float

    def __post_init__(self) -> None:
        if not (math.isfinite(float(self.scale)) and float(self.scale) > 0):
            raise GraphampError(
                f"StaticLossScaling: the scale must be finite and > 0, got {self.scale} (at 0 "
                "every gradient is 0 and its unscaling not finite: each step would be skipped)"
            )

    @property
    def initial_scale(self) -> float:
        return float(self.scale)

    def describe(self) -> str:
        return f"static loss scale {self.scale:g}"


LossScaling = DynamicLossScaling | StaticLossScaling
