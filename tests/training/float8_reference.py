"""Eager references for float8 training steps (no tests here): the model graphamp converts,
with torchao 0.18's ``Float8Linear`` (or a Transformer Engine delayed-scaling layer written
out below) in place of the layers the step put in float8, trained by torch.optim's AdamW.

The rest of the forward pass is graphamp's own bfloat16 conversion (its plan decides the other
ops' precision, which autocast would decide differently), so a difference between the step
and the reference is the float8 part: the quantisers, the scaled GEMMs of the output and both
gradients, and, for delayed scaling, the amax history and scale updates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import fx, nn

from graphamp.fx.conversion import convert
from graphamp.fx.dialect.float8_step import LINEAR, weight_source
from graphamp.fx.dialect.reader import stable_names

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def swap_layers(
    model: nn.Module,
    inputs: tuple[Any, ...],
    layers: set[str],
    make: Callable[[torch.Tensor, torch.Tensor | None, str], nn.Module],
) -> fx.GraphModule:
    """``model`` converted to bfloat16 by graphamp (master weights, static shapes), each
    ``aten.linear`` named in ``layers`` replaced by ``make(weight, bias, name)`` called on
    the layer's input; the module's parameters are the converted module's own."""
    module, _ = convert(model, inputs, dtype="bfloat16", dynamic_shapes="static")
    names = stable_names(module)
    found = set()
    for node in list(module.graph.nodes):
        name = names.get(node.name)
        if node.target is not LINEAR or name not in layers:
            continue
        x, weight, *rest = node.args
        bias = rest[0] if rest else None
        w = module.get_parameter(weight_source(module, weight).target)  # type: ignore[union-attr]
        b = None if bias is None else module.get_parameter(weight_source(module, bias).target)  # type: ignore[union-attr]
        target = f"float8_{len(found)}"
        module.add_module(target, make(w, b, name))
        with module.graph.inserting_before(node):
            replacement = module.graph.call_module(target, (x,))
        node.replace_all_uses_with(replacement)
        module.graph.erase_node(node)
        found.add(name)
    assert found == layers, sorted(layers - found)
    module.graph.eliminate_dead_code()
    module.recompile()
    return module


def torchao_layer(config: Any) -> Callable[[torch.Tensor, torch.Tensor | None, str], nn.Module]:
    from torchao.float8.float8_linear import Float8Linear

    def make(weight: torch.Tensor, bias: torch.Tensor | None, name: str) -> nn.Module:
        layer = Float8Linear(weight.shape[1], weight.shape[0], bias=False, config=config)
        layer.weight, layer.bias = weight, bias  # shared with the module: one parameter
        return layer

    return make


# --- Transformer Engine's delayed scaling, eagerly ------------------------------------------


def te_update(history: np.ndarray, scale: float, fp8_max: float) -> tuple[np.ndarray, float]:
    """delayed_scaling.cu's update for one value (algorithm "max", margin 0), as a loop."""
    f32 = np.float32
    length, last = len(history), f32(history[0])
    amax, updated = f32(0), np.zeros(length, dtype=f32)
    for i in range(length):
        a = f32(history[i + 1]) if i < length - 1 else last
        amax = np.fmax(amax, a)
        updated[i] = a if i > 0 else f32(0)
    new_scale = f32(f32(fp8_max) / amax) if np.isfinite(amax) and amax > 0 else f32(scale)
    return updated, float(new_scale)


class DelayedState:
    """One history and scale per quantised value (name -> arrays), Transformer Engine's
    layout: slot 0 takes this step's amax, the update after the step rolls it."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.history: dict[str, np.ndarray] = {}
        self.scale: dict[str, float] = {}

    def quantise(
        self, name: str, value: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        amax = torch.max(torch.abs(value)).float()
        history = self.history.setdefault(name, np.zeros(self.length, dtype=np.float32))
        history[0] = amax.item()
        kept = self.scale.get(name, 0.0)
        if kept > 0:
            scale = torch.tensor(kept, dtype=torch.float32)
        else:  # the first step: its own amax, as current scaling (torchao's formula)
            scale = (FP8_MAX[dtype] / torch.clamp(amax.double(), min=1e-12)).float()
        scaled = torch.clamp(value.float() * scale, -FP8_MAX[dtype], FP8_MAX[dtype])
        return scaled.to(dtype), scale

    def update(self) -> None:
        for name, history in self.history.items():
            fp8_max = 57344.0 if name.endswith("grad_output") else 448.0
            self.history[name], self.scale[name] = te_update(
                history, self.scale.get(name, 0.0), fp8_max
            )


def _mm(
    a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, fast: bool
) -> torch.Tensor:
    """a @ b with a row-major and b column-major, as cuBLASLt's float8 GEMM takes them."""
    return torch._scaled_mm(
        a.contiguous(),
        b.t().contiguous().t(),
        sa.reciprocal(),
        sb.reciprocal(),
        out_dtype=torch.bfloat16,
        use_fast_accum=fast,
    )


class _DelayedProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, state, name):  # type: ignore[no-untyped-def]
        e4m3 = torch.float8_e4m3fn
        qx, sx = state.quantise(f"{name}.input", x, e4m3)
        qw, sw = state.quantise(f"{name}.weight", weight, e4m3)
        ctx.save_for_backward(qx, sx, qw, sw)
        ctx.state, ctx.name, ctx.weight_dtype = state, name, weight.dtype
        return _mm(qx, sx, qw.t(), sw, True)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        qx, sx, qw, sw = ctx.saved_tensors
        qg, sg = ctx.state.quantise(f"{ctx.name}.grad_output", grad, torch.float8_e5m2)
        grad_input = _mm(qg, sg, qw, sw, False)
        grad_weight = _mm(qg.t(), sg, qx, sx, False).to(ctx.weight_dtype)
        return grad_input, grad_weight, None, None


class DelayedLinear(nn.Module):
    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, name: str, state: DelayedState
    ) -> None:
        super().__init__()
        self.weight, self.bias, self.name, self.state = weight, bias, name, state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        out = _DelayedProduct.apply(rows, self.weight, self.state, self.name)
        out = out.reshape(*x.shape[:-1], out.shape[-1])
        return out if self.bias is None else out + self.bias.to(out.dtype)


def delayed_layer(
    state: DelayedState,
) -> Callable[[torch.Tensor, torch.Tensor | None, str], nn.Module]:
    def make(weight: torch.Tensor, bias: torch.Tensor | None, name: str) -> nn.Module:
        return DelayedLinear(weight, bias, name, state)

    return make
