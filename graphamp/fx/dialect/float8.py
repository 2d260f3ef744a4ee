"""Float8 matrix products in aten ops: the quantiser, the scaled GEMM and the scale updates
the float8 nodes of a training step are built from (:mod:`graphamp.fx.dialect.float8_lowering`), and
the mark a step is traced with.

A matrix product the plan puts in float8 is traced as :func:`float8_mm`, a mark that computes
the high-precision product while the step is traced and whose backward is two more marks
(the gradient of the input, of the weight). The ``fp8_scaling`` pass replaces each with a
scaled GEMM on quantised operands, quantising every operand once per value and granularity.

The arithmetic is torchao's (``torchao/float8/float8_utils.py``, 0.18), which its training
recipes run and which is bit-equal to its ``Float8Linear`` on a CPU:

* amax: ``max |x|`` in the value's own type (exact in float32);
* scale (current): ``float8_max / max(amax, 1e-12)`` in float64, rounded to float32 once;
  rowwise scales are rounded down to a power of two;
* quantise: ``clamp(x.float() * scale, -float8_max, float8_max)`` then the cast. torch 2.13
  saturates E4M3 itself but not E5M2 (60928 rounds to 57344, 61440 to inf); the explicit clamp
  makes both formats saturate, as ONNX's ``Cast(saturate=1)`` does, so the two dialects agree;
* GEMM: ``torch._scaled_mm(a, b, 1 / scale_a, 1 / scale_b)`` with ``a`` row-major and ``b``
  column-major, the only layout cuBLASLt's float8 GEMM (and inductor's lowering) takes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from graphamp.errors import InternalError

FORMATS = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
EPS = 1e-12  # torchao's floor for an amax (a zero tensor gets a huge, finite scale)

# What each marked GEMM computes from its two operands, as the traced values hold them:
# the layer's output x @ w.T, the input's gradient g @ w, the weight's gradient g.T @ x.
GEMMS = ("output", "grad_input", "grad_weight")
# The operand each GEMM reads in each slot.
OPERANDS = {
    "output": ("input", "weight"),
    "grad_input": ("grad_output", "weight"),
    "grad_weight": ("grad_output", "input"),
}


def fp8_max(fmt: str) -> float:
    return float(torch.finfo(FORMATS[fmt]).max)


def high_precision_mm(a: torch.Tensor, b: torch.Tensor, gemm: str) -> torch.Tensor:
    """The product a marked GEMM stands for, in float32."""
    if gemm == "output":
        return a.float() @ b.float().t()
    if gemm == "grad_input":
        return a.float() @ b.float()
    if gemm == "grad_weight":
        return a.float().t() @ b.float()
    raise InternalError(f"unknown float8 GEMM {gemm!r}")


@torch.library.custom_op("graphamp::float8_mm", mutates_args=())
def float8_mm(a: torch.Tensor, b: torch.Tensor, gemm: str, key: str) -> torch.Tensor:
    """A matrix product to run in float8 (``gemm`` one of :data:`GEMMS`, ``key`` the plan's
    node for the layer), its result in ``a``'s type (torchao's: the input's for the output,
    the gradient's for both gradients). It computes in float32 while a step is traced; the
    ``fp8_scaling`` pass replaces every one."""
    return high_precision_mm(a, b, gemm).to(a.dtype)


@float8_mm.register_fake
def _(a: torch.Tensor, b: torch.Tensor, gemm: str, key: str) -> torch.Tensor:
    rows = a.shape[1] if gemm == "grad_weight" else a.shape[0]
    columns = b.shape[0] if gemm == "output" else b.shape[1]
    return a.new_empty((rows, columns))


# ``ctx``: autograd's context object, which carries the GEMM's key as an attribute of ours.
def _setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    a, b, gemm, key = inputs
    if gemm != "output":
        raise InternalError("only a layer's output GEMM is differentiated")
    ctx.save_for_backward(a, b)
    ctx.key = key


def _backward(
    ctx: Any, grad: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
    """The input's and the weight's gradients as two more marked GEMMs, each in the
    gradient's type as torchao's are (the weight's then widened to a float32 master's), and
    only where autograd needs them (a model's input takes none)."""
    x, w = ctx.saved_tensors
    grad_input = grad_weight = None
    if ctx.needs_input_grad[0]:
        grad_input = float8_mm(grad, w, "grad_input", ctx.key).to(x.dtype)
    if ctx.needs_input_grad[1]:
        grad_weight = float8_mm(grad, x, "grad_weight", ctx.key).to(w.dtype)
    return grad_input, grad_weight, None, None


# torch.func's transforms cannot differentiate a custom op: a step through these marks is
# traced with torch.autograd under Python functionalization (graphamp.fx.training.differentiate).
float8_mm.register_autograd(_backward, setup_context=_setup)


FLOAT8_MM = torch.ops.graphamp.float8_mm.default


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, key: str
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` as a marked float8 GEMM: ``x`` flattened to rows, the
    product in ``x``'s type, the bias added after it in that type (as torchao's
    ``Float8Linear``: ``_scaled_mm`` takes no bias with a float32 output)."""
    rows = x.reshape(-1, x.shape[-1])
    out = float8_mm(rows, weight, "output", key)
    out = out.reshape(*x.shape[:-1], weight.shape[0])
    return out if bias is None else out + bias.to(out.dtype)


# the arithmetic -------------------------------------------------------------------------------


def amax(value: torch.Tensor, axis: int | None) -> torch.Tensor:
    """``max |value|`` over the whole value (``axis`` None) or along ``axis`` (kept as a
    dimension of 1), in float32 (exact: the value's own type is at most float32)."""
    if axis is None:
        return torch.max(torch.abs(value)).float()
    return torch.amax(torch.abs(value), dim=axis, keepdim=True).float()


def scale_of(amax_value: torch.Tensor, fmt: str, power_of_2: bool = False) -> torch.Tensor:
    """The current scale for ``amax_value``: torchao's ``amax_to_scale`` (float64 division,
    rounded once to float32; rowwise recipes round it down to a power of two)."""
    scale = (fp8_max(fmt) / torch.clamp(amax_value.double(), min=EPS)).float()
    if power_of_2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return scale


def quantize(value: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """``value * scale`` in float32, clamped to the format's range, cast to it."""
    limit = fp8_max(fmt)
    scaled = value.to(torch.float32) * scale
    return torch.clamp(scaled, min=-limit, max=limit).to(FORMATS[fmt])


def row_major(value: torch.Tensor) -> torch.Tensor:
    return value.contiguous()


def column_major(value: torch.Tensor) -> torch.Tensor:
    return value.t().contiguous().t()


def scaled_mm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype,
    fast_accum: bool,
) -> torch.Tensor:
    """``(a / a_scale) @ (b / b_scale)`` with the operands in the TN layout. Rowwise scales
    (``(M, 1)`` and ``(1, N)``) without fast accumulation run as torchao runs them: a GEMM
    with unit scales in bfloat16, then the scales' product multiplied in (the rowwise
    kernels are slow without fast accumulation)."""
    a, b = row_major(a), column_major(b)
    a_inverse, b_inverse = a_scale.reciprocal(), b_scale.reciprocal()
    rowwise = a_scale.dim() == 2
    if rowwise and not fast_accum:
        one = a_inverse.new_ones(())
        out = torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
        out = out * (a_inverse * b_inverse)  # in bfloat16, as torchao's in-place multiply
        return out.to(out_dtype)
    narrow = torch.bfloat16 if rowwise and out_dtype != torch.bfloat16 else out_dtype
    out = torch._scaled_mm(a, b, a_inverse, b_inverse, out_dtype=narrow, use_fast_accum=fast_accum)
    return out.to(out_dtype)


def delayed_update(
    history: torch.Tensor, scale: torch.Tensor, fmt: str, algorithm: str, margin: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Transformer Engine's ``amax_and_scale_update`` (``recipe/delayed_scaling.cu``) for one
    value: ``history`` (length L, the newest amax in slot 0) rolled one place towards the
    front with slot 0 zeroed for the next step's amax; the amax used is the history's
    largest (``max``) or its newest (``most_recent``); the scale is
    ``float8_max * 2**-margin / amax``, or the old one where that amax is 0, inf or NaN."""
    rolled = torch.roll(history, -1, 0)
    if algorithm == "max":
        # the kernel's reduction: fmaxf from 0, which passes over NaN
        chosen = torch.where(torch.isnan(history), 0.0, history).amax().clamp(min=0.0)
    elif algorithm == "most_recent":
        chosen = history[0]
    else:
        raise InternalError(f"unknown amax algorithm {algorithm!r}")
    # float32 throughout, as the kernel: 448 * powf(2, -margin), then a true division (a
    # number divided by a tensor is its reciprocal times the number: 1 ulp off)
    scaled_max = np.float32(fp8_max(fmt)) * np.power(np.float32(2), np.float32(-margin))
    dividend = torch.full_like(chosen, float(scaled_max))
    usable = torch.isfinite(chosen) & (chosen > 0)
    new_scale = torch.where(usable, torch.div(dividend, chosen), scale)
    new_history = torch.cat([rolled.new_zeros(1), rolled[1:]])
    return new_history, new_scale
