"""Building the float8 nodes of a training step (:mod:`graphamp.passes.fp8_scaling`) in aten
ops, from the arithmetic of :mod:`graphamp.fx.dialect.float8`: each kind a function over tensors
that :mod:`graphamp.fx.dialect.lowering` traces and copies into the step graph."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from graphamp.core.graph import NodeKind, OpNode
from graphamp.fx.dialect import float8
from graphamp.fx.dialect.types import torch_dtype

Lowering = Callable[..., Sequence[torch.Tensor] | torch.Tensor]


def _axis(node: OpNode) -> int | None:
    axis = int(node.params["axis"])
    return None if axis < 0 else axis


def _amax(node: OpNode) -> Lowering:
    axis = _axis(node)

    def amax(value: torch.Tensor) -> torch.Tensor:
        return float8.amax(value, axis)

    return amax


def _quantize(node: OpNode) -> Lowering:
    fmt, power_of_2 = str(node.params["format"]), bool(node.params["power_of_2"])

    def current(value: torch.Tensor, amax: torch.Tensor) -> list[torch.Tensor]:
        scale = float8.scale_of(amax, fmt, power_of_2)
        return [float8.quantize(value, scale, fmt), scale]

    def delayed(value: torch.Tensor, amax: torch.Tensor, kept: torch.Tensor) -> list[torch.Tensor]:
        # A scale of 0 is none yet (the first step): this step's amax gives it.
        scale = torch.where(kept > 0, kept, float8.scale_of(amax, fmt, power_of_2))
        return [float8.quantize(value, scale, fmt), scale]

    return delayed if node.params["recipe"] == "delayed" else current


def _float8_gemm(node: OpNode) -> Lowering:
    gemm, fast_accum = str(node.params["gemm"]), bool(node.params["fast_accum"])
    out_dtype = torch_dtype(str(node.params["out_dtype"]))

    def product(
        a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor
    ) -> torch.Tensor:
        # The operands as the traced values hold them (x, w, g); the GEMM wants A (M x K)
        # and B (K x N) with per-row scales shaped (M, 1) and (1, N).
        if gemm == "output":  # x @ w.T
            b, b_scale = b.t(), b_scale.t()
        elif gemm == "grad_weight":  # g.T @ x
            a, a_scale = a.t(), a_scale.t()
        return float8.scaled_mm(a, a_scale, b, b_scale, out_dtype, fast_accum)

    return product


def _scale_update(node: OpNode) -> Lowering:
    formats = str(node.params["formats"]).split(",")
    algorithm, margin = str(node.params["algorithm"]), float(node.params["margin"])
    group = node.params.get("group")
    count = len(formats)

    def next_state(found_inf: torch.Tensor, *state: torch.Tensor) -> list[torch.Tensor]:
        amaxes, histories, scales = state[:count], state[count : 2 * count], state[2 * count :]
        if group is not None:  # every rank's largest: the ranks keep the same scales
            amaxes = _largest_over_ranks(torch.stack(list(amaxes)), str(group)).unbind()
        new_histories, new_scales = [], []
        for amax, history, scale, fmt in zip(amaxes, histories, scales, formats, strict=True):
            recorded = torch.cat([amax.reshape(1), history[1:]])  # this step's, in slot 0
            rolled, updated = float8.delayed_update(recorded, scale, fmt, algorithm, margin)
            new_histories.append(torch.where(found_inf, history, rolled))
            new_scales.append(torch.where(found_inf, scale, updated))
        return [*new_histories, *new_scales]

    return next_state


def _largest_over_ranks(values: torch.Tensor, group: str) -> torch.Tensor:
    from torch.distributed import _functional_collectives as collectives

    named: Any = group  # the group's name, as the functional collectives take it
    return collectives.wait_tensor(collectives.all_reduce(values, "max", named))


LOWERINGS: dict[NodeKind, Callable[[OpNode], Lowering]] = {
    NodeKind.AMAX: _amax,
    NodeKind.QUANTIZE: _quantize,
    NodeKind.FLOAT8_GEMM: _float8_gemm,
    NodeKind.SCALE_UPDATE_FP8: _scale_update,
}
