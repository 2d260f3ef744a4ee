"""Optimizers as pure functions of (parameters, gradients, state): torch.optim's SGD, Adam
and AdamW formulas (the single-tensor ones) on tensors, so a training step traces them into its
graph; and the conversions of their state to and from torch.optim's own layout.

Parameters of any float type train as torch.optim trains them: the optimizer reads each
gradient and keeps each state tensor in its parameter's type, and every operation runs in that
type, as the eager step's does. Most of torch.optim's operations take their hyper-parameters
as Python numbers fixed when the step is captured, so the graph calls the same aten op with the
same number on the same types: the same kernel, the same bits. The learning rate and Adam's
step size change between calls, so the graph reads them from tensors, and the two operations
that take them as numbers are reproduced: ``addcdiv`` on a bfloat16/float16 parameter computes
in float32 and rounds once (what its kernel does), and SGD's ``add(grad, alpha=-lr)``, whose
CPU kernel rounds differently in its vector body and its scalar tail, is the kernel itself
called with the rate as a number (:func:`descend`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphamp.errors import GraphampError

OPTIMIZERS = ("SGD", "Adam", "AdamW")
# Flags that choose torch.optim's implementation, not its arithmetic: the graph is one
# implementation of the same formulas, so they are accepted and ignored.
_IMPLEMENTATION_FLAGS = ("foreach", "fused", "capturable", "differentiable")
# Parameter types whose kernels compute in their own type (no wider one to reproduce).
_WIDE = (torch.float32, torch.float64)


@dataclass(frozen=True)
class ParamGroup:
    """One optimizer parameter group: the model's names of its trainable parameters and its
    hyper-parameters. ``lr`` is not here: it is read from the optimizer at every call, so
    learning-rate schedulers work; the other hyper-parameters are fixed into the graph."""

    names: tuple[str, ...]
    hyper: dict[str, Any]


def fixed_hyper(group: dict[str, Any]) -> dict[str, Any]:
    skip = ("params", "lr", *_IMPLEMENTATION_FLAGS)
    return {key: value for key, value in group.items() if key not in skip}


def optimizer_groups(optimizer: torch.optim.Optimizer, model: nn.Module) -> list[ParamGroup]:
    """The optimizer's parameter groups by the model's parameter names. Parameters that do not
    require grad are left out (torch.optim skips them: they never get a gradient)."""
    kind = type(optimizer).__name__
    if kind not in OPTIMIZERS:
        raise GraphampError(f"optimizer {kind}: train_step supports {', '.join(OPTIMIZERS)}")
    names_by_id = {id(param): name for name, param in model.named_parameters()}
    groups = []
    for index, group in enumerate(optimizer.param_groups):
        names = []
        for param in group["params"]:
            if id(param) not in names_by_id:
                raise GraphampError(
                    f"optimizer parameter group {index}: holds a tensor of shape "
                    f"{tuple(param.shape)} that is not a parameter of the model"
                )
            if param.requires_grad:
                names.append(names_by_id[id(param)])
        groups.append(ParamGroup(tuple(names), fixed_hyper(group)))
    return groups


def without(groups: Sequence[ParamGroup], names: frozenset[str]) -> list[ParamGroup]:
    """``groups`` without the parameters ``names``."""
    return [
        ParamGroup(tuple(n for n in group.names if n not in names), group.hyper) for group in groups
    ]


def state_keys(kind: str, hyper: dict[str, Any]) -> tuple[str, ...]:
    if kind == "SGD":
        return ("momentum",) if hyper["momentum"] else ()
    moments = ("exp_avg", "exp_avg_sq")
    return (*moments, "max_exp_avg_sq") if hyper["amsgrad"] else moments


def initial_state(
    kind: str, groups: Sequence[ParamGroup], params: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {"step": torch.tensor(0.0)}
    for group in groups:
        for name in group.names:
            for key in state_keys(kind, group.hyper):
                state[f"{key}:{name}"] = torch.zeros_like(params[name])
    return state


# torch.optim's state keys for ours
_TORCH_STATE_KEYS = {"momentum": "momentum_buffer"}


def resume_state(
    kind: str,
    groups: Sequence[ParamGroup],
    state: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    share: bool = False,
) -> dict[str, torch.Tensor]:
    """``state`` with the optimizer's own state where it has some (a resumed run): its
    momentum buffers / moments and step count. With ``share``, a buffer already of the type
    and layout the step keeps is the optimizer's tensor itself (the step then trains it in
    place, and holds the moments once), else a copy."""
    model_params = dict(model.named_parameters())
    resumed = dict(state)
    for group in groups:
        for name in group.names:
            own = optimizer.state.get(model_params[name], {})
            for key in state_keys(kind, group.hyper):
                value = own.get(_TORCH_STATE_KEYS.get(key, key))
                if value is None:
                    continue
                kept = resumed[f"{key}:{name}"]  # the type the step keeps it in, the parameter's
                if share and same_layout(value, kept):
                    resumed[f"{key}:{name}"] = value.detach()
                else:
                    resumed[f"{key}:{name}"] = value.detach().clone().to(kept.dtype)
            if kind == "SGD" and own.get("momentum_buffer") is not None:
                # SGD keeps no step count; one past the first step makes the buffer count.
                resumed["step"] = torch.tensor(1.0)
            elif "step" in own:
                resumed["step"] = torch.tensor(float(own["step"]))
    return resumed


def export_state(
    kind: str,
    groups: Sequence[ParamGroup],
    state: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
) -> None:
    """Write ``state`` into ``optimizer.state`` in torch.optim's own layout, so that
    ``optimizer.state_dict()`` checkpoints the run."""
    if float(state["step"]) == 0:
        return
    model_params = dict(model.named_parameters())
    for group in groups:
        for name in group.names:
            own: dict[str, Any] = {}
            if kind == "SGD":
                use = bool(group.hyper["momentum"])
                own["momentum_buffer"] = state[f"momentum:{name}"].clone() if use else None
            else:
                own["step"] = state["step"].clone()
                for key in state_keys(kind, group.hyper):
                    own[key] = state[f"{key}:{name}"].clone()
            optimizer.state[model_params[name]] = own


def update(
    kind: str,
    groups: Sequence[ParamGroup],
    lrs: Sequence[torch.Tensor],
    params: dict[str, torch.Tensor],
    grads: dict[str, torch.Tensor],
    state: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One step of torch.optim's SGD / Adam / AdamW (the single-tensor formulas) on every
    group's parameters; ``lrs`` holds each group's learning rate as a tensor.

    Each formula runs one operation at a time over all of a group's tensors, as torch.optim's
    foreach implementations do: the traced graph then holds runs of the same operation on
    independent tensors, which an eager step calls as one foreach op each
    (:mod:`graphamp.fx.training.foreach`). The values are the single-tensor formulas' own."""
    step = state["step"] + 1
    new_params: dict[str, torch.Tensor] = {}
    new_state = {"step": step}
    for group, lr in zip(groups, lrs, strict=True):
        h, names = group.hyper, group.names
        group_params = [params[name] for name in names]
        # torch.optim reads a gradient in its parameter's type (autograd's): a float32
        # gradient of a bfloat16 parameter (unscaled, accumulated) is rounded to it first.
        as_read = [grads[n].to(params[n].dtype) for n in names]
        group_grads = [-g for g in as_read] if h["maximize"] else as_read
        old = {key: [state[f"{key}:{name}"] for name in names] for key in state_keys(kind, h)}
        if kind == "SGD":
            stepped, new = _sgd(h, lr, step, group_params, group_grads, old)
        else:
            stepped, new = _adam(kind, h, lr, step, group_params, group_grads, old)
        new_params.update(zip(names, stepped, strict=True))
        for key, values in new.items():
            new_state.update((f"{key}:{n}", v) for n, v in zip(names, values, strict=True))
    return new_params, new_state


def _each(function: Callable[..., torch.Tensor], *lists: Sequence[Any]) -> list[torch.Tensor]:
    """``function`` over the lists' elements, position by position."""
    return [function(*values) for values in zip(*lists, strict=True)]


def _sgd(
    h: dict[str, Any],
    lr: torch.Tensor,
    step: torch.Tensor,
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    old: dict[str, list[torch.Tensor]],
) -> tuple[list[torch.Tensor], dict[str, list[torch.Tensor]]]:
    """torch.optim.SGD's step on one group: the new parameters and momentum buffers (``old``
    and the result hold each state key's tensors, in the parameters' order)."""
    momentum, buffers = h["momentum"], {}
    if h["weight_decay"]:
        grads = _each(lambda g, p: torch.add(g, p, alpha=h["weight_decay"]), grads, params)
    if momentum:
        if h["dampening"]:
            # The first step's buffer is the gradient itself, as in torch.optim.SGD.
            kept = _each(lambda b: b * momentum, old["momentum"])
            damped = _each(lambda k, g: torch.add(k, g, alpha=1 - h["dampening"]), kept, grads)
            new = _each(lambda g, d: torch.where(step == 1, g, d), grads, damped)
        else:  # the same: the buffer starts at zero (multiplied, then added: torch.optim's
            # rounding; one add with alpha rounds the product and the sum once, in an FMA)
            kept = _each(lambda b: b * momentum, old["momentum"])
            new = _each(torch.add, kept, grads)
        buffers = {"momentum": new}
        grads = (
            _each(lambda g, b: torch.add(g, b, alpha=momentum), grads, new)
            if h["nesterov"]
            else new
        )
    return _each(lambda p, g: descend(p, g, lr), params, grads), buffers


def descend(param: torch.Tensor, direction: torch.Tensor, lr: torch.Tensor) -> torch.Tensor:
    """SGD's last operation, ``param.add(direction, alpha=-lr)``, with ``lr`` a tensor.

    In float32 that kernel is one fused multiply-add, which ``addcmul(param, direction, lr,
    value=-1)`` computes too (an op a step graph makes in place and groups into one foreach
    call). In a lower type it is not one formula: the CPU kernel rounds ``-lr`` to the type,
    then its vector body computes in float32 and rounds once, its scalar tail rounds the
    product first. The graph calls that kernel itself (:func:`_descend`)."""
    if param.dtype in _WIDE:
        return torch.addcmul(param, direction, lr, value=-1)
    return _descend(param, direction, lr)


@torch.library.custom_op("graphamp::descend", mutates_args=())
def _descend(param: torch.Tensor, direction: torch.Tensor, lr: torch.Tensor) -> torch.Tensor:
    """``param.add(direction, alpha=-lr)`` as torch.optim.SGD calls it, ``lr`` as a number
    (reading a CPU tensor costs nothing). Where ``lr`` lives on an accelerator, reading it
    would wait for the device: there the update is computed in float32 and rounded once, as
    torch.optim's multi-tensor kernels (its default there) compute it."""
    if lr.device.type == "cpu":
        return param.add(direction, alpha=-lr.item())
    return torch.addcmul(param.float(), direction.float(), lr, value=-1).to(param.dtype)


@_descend.register_fake
def _(param: torch.Tensor, direction: torch.Tensor, lr: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(param)


def _adam(
    kind: str,
    h: dict[str, Any],
    lr: torch.Tensor,
    step: torch.Tensor,
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    old: dict[str, list[torch.Tensor]],
) -> tuple[list[torch.Tensor], dict[str, list[torch.Tensor]]]:
    """torch.optim.Adam's (AdamW's) step on one group: the new parameters and moments (as
    :func:`_sgd`'s)."""
    beta1, beta2 = h["betas"]
    if h["weight_decay"]:
        if h.get("decoupled_weight_decay", kind == "AdamW"):
            decay = 1 - lr * h["weight_decay"]
            params = _each(lambda p: p * decay, params)
        else:
            grads = _each(lambda g, p: torch.add(g, p, alpha=h["weight_decay"]), grads, params)
    exp_avg = _each(lambda m, g: torch.lerp(m, g, 1 - beta1), old["exp_avg"], grads)
    kept = _each(lambda s: s * beta2, old["exp_avg_sq"])
    exp_avg_sq = _each(lambda k, g: torch.addcmul(k, g, g, value=1 - beta2), kept, grads)
    moments = {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    if h["amsgrad"]:
        exp_avg_sq = _each(torch.maximum, old["max_exp_avg_sq"], exp_avg_sq)
        moments["max_exp_avg_sq"] = exp_avg_sq
    # The bias corrections and the step size in float64, as torch.optim computes them in
    # Python floats (``lr`` is a float64 tensor): each is then rounded to float32 once, where
    # it multiplies or divides a tensor (a bfloat16/float16 tensor's kernel reads a number as
    # float32 too).
    step64 = step.double()
    bias2_root = (1 - beta2**step64).sqrt()
    denom = _each(torch.sqrt, exp_avg_sq)
    denom = _each(lambda d: d / bias2_root, denom)
    denom = _each(lambda d: d + h["eps"], denom)
    step_size = lr / (1 - beta1**step64)
    # The last operation, param.addcdiv(exp_avg, denom, value=-step_size): its kernel computes
    # param + value * exp_avg / denom in float32 (a bfloat16/float16 tensor's values widened)
    # and rounds once to the parameter's type.
    change = _each(lambda m: step_size * m, _widened(exp_avg))
    change = _each(torch.div, change, _widened(denom))
    stepped = _each(torch.sub, _widened(params), change)
    return _each(lambda new, p: new.to(p.dtype), stepped, params), moments


def _widened(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` as a kernel computing on them reads them: bfloat16/float16 as float32."""
    return [t if t.dtype in _WIDE else t.float() for t in tensors]


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` can stand for ``b`` in a captured graph: shape, type, device, strides."""
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and a.device == b.device
        and a.stride() == b.stride()
    )
