"""``graphamp.fx.train_step``: a training step as one mixed-precision graph, replicated
(:class:`~graphamp.fx.training.step.TrainStep`, on one process or data-parallel over a process
group) or sharded over a device mesh (:class:`~graphamp.fx.training.sharded.ShardedTrainStep`,
FSDP)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from graphamp.errors import GraphampError
from graphamp.fx.conversion import check_arguments, dtype_name
from graphamp.fx.dialect import float8_step
from graphamp.fx.distributed import data_parallel, fsdp
from graphamp.fx.training.sharded import ShardedTrainStep, sharding_of
from graphamp.fx.training.step import TrainStep
from graphamp.policy.policy import Policy
from graphamp.training.distributed import GradientClipping
from graphamp.training.scaling import DynamicLossScaling, LossScaling, StaticLossScaling


def train_step(
    model: nn.Module,
    loss_fn: Callable[..., torch.Tensor],
    optimizer: torch.optim.Optimizer,
    *,
    policy: Policy | None = None,
    loss_scaling: LossScaling | str | None = "default",
    accumulate: int = 1,
    process_group: Any = None,
    grad_dtype: str | torch.dtype | None = None,
    clip_grad_norm: float | None = None,
    bucket_bytes: int | None = None,
    agree_found_inf: bool = False,
    mesh: Any = None,
    fp8: Any = None,
    keep_model: bool = False,
    recompute_casts: bool | None = None,
    **policy_overrides: Any,
) -> TrainStep:
    """A training step for ``model`` as one mixed-precision graph (captured on first call,
    and again on each batch of a shape or type not seen before:
    :mod:`graphamp.fx.training.signatures`).

    ``loss_scaling`` defaults to :class:`DynamicLossScaling` for float16 and to none for
    bfloat16 (it has float32's range). ``accumulate=k`` keeps the scale fixed over k
    micro-batches and unscales, checks and updates once per effective batch.

    With ``process_group`` (a torch.distributed ProcessGroup, or ``"world"``) each rank runs
    the step on its share of the batch and the gradients are averaged over the group inside
    the graph, in buckets of ``bucket_bytes`` (DDP's 25 MiB by default, and then a first
    bucket of 1 MiB, as DDP's), travelling as ``grad_dtype`` ("float16", "bfloat16" or their
    torch.dtype, or None for float32); the ranks agree on skipping a non-finite step (any
    rank's inf or NaN is in every rank's average; ``agree_found_inf`` also all-reduces the
    finite check's flag with MAX, a collective more per step).
    ``clip_grad_norm=max_norm`` clips the unscaled gradients by their global 2-norm, as
    ``GradScaler.unscale_`` then ``clip_grad_norm_``.

    The step trains the model's own parameters and buffers in place, as ``optimizer.step()``
    does: they are its float32 master weights, held once. ``keep_model=True`` leaves the model
    as it was: the step trains copies of its own (the parameters' memory twice), written into
    the model by ``step.copy_to()``.

    ``recompute_casts`` holds less between forward and backward, as activation checkpointing
    does: each weight's low-precision copy, and each float32 copy of a low-precision
    activation, is computed again where the backward reads it instead of being held from the
    forward (the low-precision activation is held in its place); the values are the same bit
    for bit. None (the default) does it in the eager step on a CPU, where it cost no
    consistent time (BERT-base at batch 8: peak 0.73x float32's, against 0.84x without;
    BENCHMARKS.md), and not on a GPU, where it is one more cast of every
    weight a step, nor in a compiled step; True or False decides everywhere, compiled steps
    included. torch.autocast holds both.

    A model sharded with FSDP2's ``fully_shard`` (its parameters DTensors), or an unsharded
    one with ``mesh`` (a 1-D DeviceMesh: the step calls ``fully_shard(model, mesh=mesh)`` and
    points the optimizer at the shards), trains sharded (:mod:`graphamp.fx.training.sharded`): each
    rank holds its shard of every parameter and of the optimizer state; the graph gathers the
    whole parameters (in the low type where only low-precision ops read them) and
    reduce-scatters the gradients as ``grad_dtype`` (None: the type the model's FSDP2
    MixedPrecisionPolicy reduces in, else float32).
    """
    where = "train_step()"
    if not isinstance(model, nn.Module):
        raise GraphampError(f"{where}: model is an nn.Module, got {type(model).__name__}")
    if isinstance(model, nn.parallel.DistributedDataParallel):
        raise GraphampError(
            f"{where}: model is wrapped in DistributedDataParallel; give the module inside "
            "(model.module) and process_group=: the step reduces the gradients itself "
            "(docs/distributed.md)"
        )
    if isinstance(accumulate, bool) or not isinstance(accumulate, int):
        raise GraphampError(
            f"{where}: accumulate is a whole number of micro-batches, got {accumulate!r}"
        )
    check_arguments(where, policy=policy, fp8=fp8, keep_model=keep_model)
    if "dtype" in policy_overrides:  # torch.float16 as "float16"
        policy_overrides["dtype"] = dtype_name(policy_overrides["dtype"])
    grad_type: str | None = dtype_name(grad_dtype)
    if loss_scaling == "default":
        dtype = policy.dtype if policy is not None else policy_overrides.get("dtype", "bfloat16")
        loss_scaling = DynamicLossScaling() if dtype == "float16" else None
    if loss_scaling is not None and not isinstance(
        loss_scaling, DynamicLossScaling | StaticLossScaling
    ):
        raise GraphampError("loss_scaling: a DynamicLossScaling, a StaticLossScaling or None")
    if recompute_casts is not None and not isinstance(recompute_casts, bool):
        raise GraphampError(f"recompute_casts: True, False or None, got {recompute_casts!r}")
    if fp8 is not None:
        dtype = policy.dtype if policy is not None else policy_overrides.get("dtype", "bfloat16")
        float8_step.check_settings(fp8, dtype, loss_scaling, accumulate)
    clipping = GradientClipping(float(clip_grad_norm)) if clip_grad_norm is not None else None
    if mesh is not None or fsdp.is_sharded(model):
        if keep_model:
            raise GraphampError(
                "keep_model: a sharded step trains the model's own shards in place; leave it out"
            )
        if agree_found_inf:
            raise GraphampError(
                "agree_found_inf: a sharded step always agrees on found_inf (each rank checks "
                "only its shards); leave it out"
            )
        data_parallel.require_initialized("mesh" if mesh is not None else "a sharded model")
        data_parallel.warn_if_group_pinned(stacklevel=3)
        if mesh is not None and not fsdp.is_sharded(model):
            fsdp.shard(model, mesh, optimizer)
        sharded = fsdp.inspect(model, optimizer, process_group, mesh, grad_type)
        return ShardedTrainStep(
            model,
            loss_fn,
            optimizer,
            policy,
            loss_scaling,
            accumulate,
            policy_overrides,
            sharded=sharded,
            sharding=sharding_of(sharded, grad_type, bucket_bytes),
            clipping=clipping,
            fp8=fp8,
            recompute_casts=recompute_casts,
        )
    _refuse_backward_hooks(model, where)
    reduce = data_parallel.gradient_reduce(process_group, grad_type, bucket_bytes, agree_found_inf)
    return TrainStep(
        model,
        loss_fn,
        optimizer,
        policy,
        loss_scaling,
        accumulate,
        policy_overrides,
        reduce=reduce,
        clipping=clipping,
        fp8=fp8,
        keep_model=keep_model,
        recompute_casts=recompute_casts,
    )


def _refuse_backward_hooks(model: nn.Module, where: str) -> None:
    """A step computes every gradient in its own graph, so hooks autograd would call on the
    way back (a pruning mask on a weight's gradient, a module's full backward hook) are never
    called: refused, naming the first, rather than training as if they were not there."""
    for name, parameter in model.named_parameters():
        hooks = getattr(parameter, "_backward_hooks", None) or getattr(
            parameter, "_post_accumulate_grad_hooks", None
        )
        if hooks:
            raise GraphampError(
                f"{where}: parameter {name!r} has a gradient hook (Tensor.register_hook or "
                "register_post_accumulate_grad_hook), which the step's own backward would never "
                "call; apply what it does in the model's forward (a mask on the weight, say) "
                "or train this model without graphamp's step"
            )
    for name, module in model.named_modules():
        if module._backward_hooks or module._backward_pre_hooks:
            raise GraphampError(
                f"{where}: module {name or type(module).__name__!r} has a backward hook "
                "(register_full_backward_hook or register_full_backward_pre_hook), which the "
                "step's own backward would never call; remove it, or train this model without "
                "graphamp's step"
            )
