"""A whole training step as one static mixed-precision graph, loss scaling inside it.

The forward pass is painted by graphamp's passes (float32 master weights, cast once per
step); backward follows the casts through autograd; the loss is multiplied by the scale,
gradients are unscaled by ``1/scale``, ``found_inf`` comes from a finite-check over all
gradients, the parameter and optimizer-state updates are selected with
``where(found_inf, old, new)`` (never by multiplying with 0: inf * 0 is NaN), and the scale is
updated with Paddle's ``update_loss_scaling`` rules. All of it is captured once with
``make_fx`` into a GraphModule: the state lives in tensors, so a step never waits for the host.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.fx.experimental.proxy_tensor import make_fx

from graphamp.errors import GraphampError
from graphamp.plan import Plan
from graphamp.policy import Policy


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

    def initial_state(self) -> dict[str, torch.Tensor]:
        return {
            "scale": torch.tensor(self.init_loss_scaling, dtype=torch.float32),
            "good": torch.tensor(0, dtype=torch.int32),
            "bad": torch.tensor(0, dtype=torch.int32),
        }

    def update(
        self, state: dict[str, torch.Tensor], found_inf: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """The next (scale, good, bad) after a step; ``found_inf`` is a 0-d bool tensor."""
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

    def initial_state(self) -> dict[str, torch.Tensor]:
        return {"scale": torch.tensor(float(self.scale), dtype=torch.float32)}

    def update(
        self, state: dict[str, torch.Tensor], found_inf: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        return dict(state)


LossScaling = DynamicLossScaling | StaticLossScaling | None


# -- optimizers as pure functions of (params, grads, state) ------------------------------------

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


def _fixed_hyper(group: dict[str, Any]) -> dict[str, Any]:
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
        groups.append(ParamGroup(tuple(names), _fixed_hyper(group)))
    return groups


def _state_keys(kind: str, hyper: dict[str, Any]) -> tuple[str, ...]:
    if kind == "SGD":
        return ("momentum",) if hyper["momentum"] else ()
    moments = ("exp_avg", "exp_avg_sq")
    return (*moments, "max_exp_avg_sq") if hyper["amsgrad"] else moments


def _initial_optimizer_state(
    kind: str, groups: Sequence[ParamGroup], params: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {"step": torch.tensor(0.0)}
    for group in groups:
        for name in group.names:
            for key in _state_keys(kind, group.hyper):
                state[f"{key}:{name}"] = torch.zeros_like(params[name])
    return state


# torch.optim's state keys for ours
_TORCH_STATE_KEYS = {"momentum": "momentum_buffer"}


def _resume_optimizer_state(
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
            for key in _state_keys(kind, group.hyper):
                value = own.get(_TORCH_STATE_KEYS.get(key, key))
                if value is not None:
                    resumed[f"{key}:{name}"] = value.detach().clone().float()
            if kind == "SGD" and own.get("momentum_buffer") is not None:
                # SGD keeps no step count; one past the first step makes the buffer count.
                resumed["step"] = torch.tensor(1.0)
            elif "step" in own:
                resumed["step"] = torch.tensor(float(own["step"]))
    return resumed


def _export_optimizer_state(
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
                for key in _state_keys(kind, group.hyper):
                    own[key] = state[f"{key}:{name}"].clone()
            optimizer.state[model_params[name]] = own


def _optimizer_update(
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


def _any_non_finite(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """One boolean tensor: does any element of ``tensors`` hold inf or NaN? The largest
    magnitude of each tensor is inf or NaN exactly when one of its elements is (max propagates
    NaN), which takes two passes in eager mode where ``isfinite(x).all()`` takes five. (``x * 0``
    would take one, but compilers rightly fold it to 0 and the check would vanish.)"""
    return ~torch.stack([t.abs().amax() for t in tensors]).isfinite().all()


# -- the step ----------------------------------------------------------------------------------


class TrainStep:
    """``step(*batch) -> loss``: ``batch[:-1]`` feeds the model, ``loss_fn(output, batch[-1])``
    gives the loss. Owns parameters, optimizer state and loss-scaling state (tensors)."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[..., torch.Tensor],
        optimizer: torch.optim.Optimizer,
        policy: Policy | None,
        loss_scaling: LossScaling,
        accumulate: int,
        overrides: dict[str, Any],
    ) -> None:
        if accumulate < 1:
            raise GraphampError(f"accumulate must be at least 1, got {accumulate}")
        self.model, self.loss_fn, self.accumulate = model, loss_fn, accumulate
        self.optimizer, self.kind = optimizer, type(optimizer).__name__
        self.groups = optimizer_groups(optimizer, model)
        self.policy, self.overrides = policy, overrides
        self.loss_scaling = loss_scaling
        self.plan: Plan | None = None
        self.graph: fx.GraphModule | None = None  # the update step (the last micro-batch)
        self.accumulate_graph: fx.GraphModule | None = None
        self._micro = 0
        self.skipped_steps = torch.tensor(0, dtype=torch.int32)
        self._rates: list[float] = []
        self._rate_tensors: list[torch.Tensor] = []

    # state ------------------------------------------------------------------------------------

    def _build(self, batch: Sequence[torch.Tensor]) -> None:
        import graphamp.fx as gfx

        inputs = tuple(batch[:-1])
        forward, self.plan = gfx.convert(
            self.model, inputs, policy=self.policy, weights="master", **self.overrides
        )
        self.forward = forward
        self.params = {n: p.detach().clone() for n, p in forward.named_parameters()}
        # Trainable: in an optimizer group and requiring grad. The others (frozen) are read
        # by the forward pass but get no gradient and no update.
        self.trainable = [name for group in self.groups for name in group.names]
        if not self.trainable:
            raise GraphampError("the optimizer holds no parameter that requires grad")
        missing = [name for name in self.trainable if name not in self.params]
        if missing:
            raise GraphampError(f"parameter {missing[0]!r} is not in the captured module")
        # Buffers (batch-norm running statistics) are updated by the forward pass as in eager
        # PyTorch, on skipped steps too; the step owns its copies.
        self.buffers = {n: b.detach().clone() for n, b in forward.named_buffers()}
        self.opt_state = _resume_optimizer_state(
            self.kind,
            self.groups,
            _initial_optimizer_state(self.kind, self.groups, self.params),
            self.optimizer,
            self.model,
        )
        self.scale_state = self._initial_scale_state()
        # All state lives where the parameters do, so no step copies between host and device.
        self.device = next(iter(self.params.values())).device
        self.opt_state = {k: v.to(self.device) for k, v in self.opt_state.items()}
        self.scale_state = {k: v.to(self.device) for k, v in self.scale_state.items()}
        self.skipped_steps = self.skipped_steps.to(self.device)
        # Gradients are carried between calls only when micro-batches accumulate.
        carried = self.trainable if self.accumulate > 1 else []
        self.grad_acc = {n: torch.zeros_like(self.params[n]) for n in carried}

        def trace(fn: Callable[..., list[torch.Tensor]]) -> fx.GraphModule:
            # functionalize turns the forward's in-place buffer updates into functional ops and
            # a copy back onto the buffer arguments; tracing runs on copies of the state.
            flat = [t.clone() for t in self._flatten()]
            lrs = self._learning_rates()
            return make_fx(torch.func.functionalize(fn, remove="mutations"))(*flat, *lrs, *batch)

        with torch.no_grad():
            self.graph = trace(self._update_fn)
            if self.accumulate > 1:
                self.accumulate_graph = trace(self._accumulate_fn)

    def _flatten(self) -> list[torch.Tensor]:
        """The step's state as the graph's leading arguments; buffers come last."""
        return [
            *self.params.values(),
            *self.opt_state.values(),
            *self.scale_state.values(),
            *self.grad_acc.values(),
            self.skipped_steps,
            *self.buffers.values(),
        ]

    def _unflatten(
        self, flat: Sequence[torch.Tensor]
    ) -> tuple[dict, dict, dict, dict, torch.Tensor]:
        """(params, optimizer state, scale state, accumulated grads, skip count) from ``flat``.
        The buffers behind them are written in place by the graph (functionalize's epilogue)."""
        sizes = [len(self.params), len(self.opt_state), len(self.scale_state), len(self.grad_acc)]
        parts, start = [], 0
        for dicts, size in zip(
            (self.params, self.opt_state, self.scale_state, self.grad_acc), sizes, strict=True
        ):
            parts.append(dict(zip(dicts.keys(), flat[start : start + size], strict=True)))
            start += size
        self._traced_buffers = dict(zip(self.buffers.keys(), flat[start + 1 :], strict=True))
        return (*parts, flat[start])  # type: ignore[return-value]

    # the traced functions ---------------------------------------------------------------------

    def _scaled_grads(
        self, params: dict[str, torch.Tensor], scale: torch.Tensor, batch: Sequence[torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        inputs, target = tuple(batch[:-1]), batch[-1]

        trainable = {name: params[name] for name in self.trainable}
        frozen = {n: p for n, p in params.items() if n not in trainable}

        def scaled_loss(
            p: dict[str, torch.Tensor], rest: dict[str, torch.Tensor]
        ) -> tuple[torch.Tensor, torch.Tensor]:
            output = torch.func.functional_call(self.forward, {**p, **rest}, inputs)
            # The loss runs in float32, as every AMP list has it: low-precision outputs are
            # widened first (a bfloat16/float32 mix also trips inductor's loss lowerings).
            output = torch.utils._pytree.tree_map(
                lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
                output,
            )
            loss = self.loss_fn(output, target).float()
            return loss * scale, loss

        # Buffers are an argument, not captured: torch.func refuses to mutate captured tensors.
        rest = {**frozen, **self._traced_buffers}
        grads, loss = torch.func.grad(scaled_loss, has_aux=True)(trainable, rest)
        return grads, loss

    def _split(self, flat_and_batch: Sequence[torch.Tensor]) -> tuple[Any, ...]:
        """The traced functions' arguments: (params, optimizer state, scale state,
        accumulated grads, skip count, learning rates, batch)."""
        count = len(self._flatten())
        lrs_end = count + len(self.groups)
        return (
            *self._unflatten(flat_and_batch[:count]),
            flat_and_batch[count:lrs_end],
            flat_and_batch[lrs_end:],
        )

    def _learning_rates(self) -> list[torch.Tensor]:
        """Each group's current ``lr``, read from the optimizer (schedulers change it); every
        other hyper-parameter is fixed into the graph, so a change to one is refused."""
        rates = []
        for group, captured in zip(self.optimizer.param_groups, self.groups, strict=True):
            fixed = _fixed_hyper(group)
            if fixed != captured.hyper:
                changed = sorted(k for k in fixed if fixed[k] != captured.hyper.get(k))
                raise GraphampError(
                    f"optimizer hyper-parameter {', '.join(changed)} changed after the step was "
                    "captured; only lr may change (build a new train_step)"
                )
            rates.append(float(group["lr"]))
        # A new tensor only when a scheduler changed a rate: on a GPU, making one is a copy
        # from the host, which the step would otherwise wait for at every call.
        if rates != self._rates:
            self._rates = rates
            self._rate_tensors = [torch.tensor(rate, device=self.device) for rate in rates]
        return self._rate_tensors

    @staticmethod
    def _results(
        loss: torch.Tensor,
        params: dict,
        opt_state: dict,
        scale_state: dict,
        grad_acc: dict,
        skipped: torch.Tensor,
    ) -> list[torch.Tensor]:
        return [
            loss,
            *params.values(),
            *opt_state.values(),
            *scale_state.values(),
            *grad_acc.values(),
            skipped,
        ]

    def _accumulate_fn(self, *flat_and_batch: torch.Tensor) -> list[torch.Tensor]:
        params, opt_state, scale_state, grad_acc, skipped, _, batch = self._split(flat_and_batch)
        grads, loss = self._scaled_grads(params, scale_state["scale"], batch)
        grad_acc = {n: grad_acc[n] + grads[n].float() for n in grad_acc}
        return self._results(loss, params, opt_state, scale_state, grad_acc, skipped)

    def _update_fn(self, *flat_and_batch: torch.Tensor) -> list[torch.Tensor]:
        params, opt_state, scale_state, grad_acc, skipped, lrs, batch = self._split(flat_and_batch)
        scale = scale_state["scale"]
        grads, loss = self._scaled_grads(params, scale, batch)
        # Accumulated micro-batches share one scale: unscale their sum once, and average. Every
        # pass over the gradients costs a read and a write of all of them, so the ones that
        # would multiply by 1 or add zeros are left out.
        total = {n: g.float() for n, g in grads.items()}
        if self.accumulate > 1:
            total = {n: grad_acc[n] + g for n, g in total.items()}
        factor = (1.0 / scale.double()).float() if self.loss_scaling is not None else None
        if self.accumulate > 1:
            factor = 1.0 / self.accumulate if factor is None else factor / self.accumulate
        if factor is not None:
            total = {n: g * factor for n, g in total.items()}
        found_inf = _any_non_finite(total.values())
        new_params, new_opt = _optimizer_update(
            self.kind, self.groups, lrs, params, total, opt_state
        )
        params = {
            **params,
            **{n: torch.where(found_inf, params[n], v) for n, v in new_params.items()},
        }
        opt_state = {k: torch.where(found_inf, opt_state[k], new_opt[k]) for k in opt_state}
        if self.loss_scaling is not None:
            scale_state = self.loss_scaling.update(scale_state, found_inf)
        skipped = skipped + found_inf.to(skipped.dtype)
        grad_acc = {n: torch.zeros_like(g) for n, g in grad_acc.items()}
        return self._results(loss, params, opt_state, scale_state, grad_acc, skipped)

    # use --------------------------------------------------------------------------------------

    def __call__(self, *batch: torch.Tensor) -> torch.Tensor:
        if len(batch) < 2:
            raise GraphampError("step(*batch): pass the model inputs and then the target")
        if self.graph is None:
            self._build(batch)
        self._micro += 1
        last = self._micro % self.accumulate == 0
        graph = self.graph if last else self.accumulate_graph
        loss, *flat = graph(*self._flatten(), *self._learning_rates(), *batch)  # type: ignore[misc]
        state = self._unflatten([*flat, *self.buffers.values()])
        self.params, self.opt_state, self.scale_state, self.grad_acc, self.skipped_steps = state
        if last:
            # What optimizer.step() records, so LR schedulers stepped after this call do not
            # warn that the optimizer never stepped.
            self.optimizer._opt_called = True  # type: ignore[attr-defined]
        return loss

    def compile(self, *batch: torch.Tensor, **options: Any) -> TrainStep:
        """Capture on ``batch`` (without stepping) and compile the step graphs with
        ``torch.compile(**options)``; returns self."""
        if self.graph is None:
            self._build(batch)
        self.graph = torch.compile(self.graph, **options)  # type: ignore[assignment]
        if self.accumulate_graph is not None:
            self.accumulate_graph = torch.compile(self.accumulate_graph, **options)  # type: ignore[assignment]
        return self

    @property
    def loss_scale(self) -> torch.Tensor:
        state = self.scale_state if self.graph is not None else self._initial_scale_state()
        return state["scale"]

    def _initial_scale_state(self) -> dict[str, torch.Tensor]:
        if self.loss_scaling is None:
            return {"scale": torch.tensor(1.0)}
        return self.loss_scaling.initial_state()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The trained parameters, by the model's parameter names."""
        return dict(self.params)

    def copy_to(self, model: nn.Module | None = None) -> None:
        """Write the trained parameters and buffers back into ``model`` (default: the one
        given). For the model given, the optimizer's state (momentum buffers, moments, step) is
        written into the optimizer too, in torch.optim's layout, so ``optimizer.state_dict()``
        checkpoints the run and a new ``train_step`` on it resumes where this one stopped."""
        target = model or self.model
        if target is self.model and self.graph is not None:
            _export_optimizer_state(
                self.kind, self.groups, self.opt_state, self.optimizer, self.model
            )
        own = {**dict(target.named_parameters()), **dict(target.named_buffers())}
        with torch.no_grad():
            for name, value in {**self.params, **self.buffers}.items():
                if name not in own:
                    raise GraphampError(f"parameter {name!r} has no counterpart in the model")
                own[name].copy_(value)


def train_step(
    model: nn.Module,
    loss_fn: Callable[..., torch.Tensor],
    optimizer: torch.optim.Optimizer,
    *,
    policy: Policy | None = None,
    loss_scaling: LossScaling = "default",
    accumulate: int = 1,  # type: ignore[assignment]
    **policy_overrides: Any,
) -> TrainStep:
    """A training step for ``model`` as one mixed-precision graph (captured on first call).

    ``loss_scaling`` defaults to :class:`DynamicLossScaling` for float16 and to none for
    bfloat16 (it has float32's range). ``accumulate=k`` keeps the scale fixed over k
    micro-batches and unscales, checks and updates once per effective batch.
    """
    if loss_scaling == "default":
        dtype = policy.dtype if policy is not None else policy_overrides.get("dtype", "bfloat16")
        loss_scaling = DynamicLossScaling() if dtype == "float16" else None
    if loss_scaling is not None and not isinstance(
        loss_scaling, DynamicLossScaling | StaticLossScaling
    ):
        raise GraphampError("loss_scaling: a DynamicLossScaling, a StaticLossScaling or None")
    if isinstance(loss_scaling, StaticLossScaling) and not math.isfinite(loss_scaling.scale):
        raise GraphampError("StaticLossScaling: the scale must be finite")
    return TrainStep(model, loss_fn, optimizer, policy, loss_scaling, accumulate, policy_overrides)
