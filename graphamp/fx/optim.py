"""Optimizers as pure functions of (parameters, gradients, state): torch.optim's SGD, Adam
and AdamW formulas (the single-tensor ones) on tensors, so a training step traces them into its
graph; and the conversions of their state to and from torch.optim's own layout."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphamp.errors import GraphampError

OPTIMIZERS = ("SGD", "Adam", "AdamW")
# Flags that choose torch.optim's implementation, not its arithmetic: the graph is one
# implementation of the same formulas, so they are accepted and ignored.
_IMPLEMENTATION_FLAGS = ("foreach", "fused", "capturable", "differentiable")


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
) -> dict[str, torch.Tensor]:
    """``state`` with the optimizer's own state where it has some (a resumed run): its
    momentum buffers / moments and step count."""
    model_params = dict(model.named_parameters())
    resumed = dict(state)
    for group in groups:
        for name in group.names:
            own = optimizer.state.get(model_params[name], {})
            for key in state_keys(kind, group.hyper):
                value = own.get(_TORCH_STATE_KEYS.get(key, key))
                if value is not None:
                    resumed[f"{key}:{name}"] = value.detach().clone().float()
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
    group's parameters; ``lrs`` holds each group's learning rate as a tensor."""
    step = state["step"] + 1
    new_params, new_state = {}, {"step": step}
    for group, lr in zip(groups, lrs, strict=True):
        h = group.hyper
        for name in group.names:
            param, grad = params[name], grads[name]
            if h["maximize"]:
                grad = -grad
            if kind == "SGD":
                if h["weight_decay"]:
                    grad = grad + h["weight_decay"] * param
                if h["momentum"]:
                    old = state[f"momentum:{name}"]
                    if h["dampening"]:
                        # The first step's buffer is the gradient itself, as in torch.optim.SGD.
                        buf = torch.where(
                            step == 1, grad, old * h["momentum"] + (1 - h["dampening"]) * grad
                        )
                    else:  # the same: the buffer starts at zero
                        buf = torch.add(grad, old, alpha=h["momentum"])
                    new_state[f"momentum:{name}"] = buf
                    grad = torch.add(grad, buf, alpha=h["momentum"]) if h["nesterov"] else buf
                new_params[name] = torch.addcmul(param, grad, lr, value=-1)
                continue
            beta1, beta2 = h["betas"]
            if h["weight_decay"]:
                if h.get("decoupled_weight_decay", kind == "AdamW"):
                    param = param * (1 - lr * h["weight_decay"])
                else:
                    grad = grad + h["weight_decay"] * param
            exp_avg = torch.lerp(state[f"exp_avg:{name}"], grad, 1 - beta1)
            exp_avg_sq = torch.addcmul(
                state[f"exp_avg_sq:{name}"] * beta2, grad, grad, value=1 - beta2
            )
            new_state[f"exp_avg:{name}"] = exp_avg
            new_state[f"exp_avg_sq:{name}"] = exp_avg_sq
            if h["amsgrad"]:
                exp_avg_sq = torch.maximum(state[f"max_exp_avg_sq:{name}"], exp_avg_sq)
                new_state[f"max_exp_avg_sq:{name}"] = exp_avg_sq
            bias1 = 1 - beta1**step
            bias2 = 1 - beta2**step
            denom = (exp_avg_sq.sqrt() / bias2.sqrt()) + h["eps"]
            new_params[name] = param - (lr / bias1) * exp_avg / denom
    return new_params, new_state
