"""Models sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``), as a sharded training
step reads them.

FSDP2 replaces each parameter by a DTensor sharded on dimension 0 over a device mesh; the
rank's rows are its local tensor, and forward hooks gather the whole parameters when the
module runs. The step reads the shards, the mesh and FSDP2's mixed-precision settings, and
captures the forward pass from a *skeleton* of the model: the same modules and buffers, no
FSDP hooks, and parameters that are fake tensors of the whole shapes, so no rank ever holds a
whole copy of the model.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.tensor import DTensor, Shard

from graphamp.errors import GraphampError
from graphamp.fx.dialect.types import dtype_name

# FSDP2 marks the modules it manages with these; the skeleton is no FSDP module.
_FSDP_ATTRIBUTES = ("_is_fsdp_managed_module", "_fsdp_use_orig_params")
_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)


@dataclass
class ShardedModel:
    """What a sharded step needs of an FSDP2 model: its parameters (DTensors, by the model's
    names), the mesh they are sharded on, its process group (by name, size and this rank's
    place: a ProcessGroup object held past destroy_process_group can abort a rank at exit),
    and the type FSDP2's mixed-precision policy reduces gradients in (None: it sets none)."""

    params: dict[str, DTensor]
    mesh: Any  # DeviceMesh
    group: str
    world_size: int
    rank: int
    reduce_dtype: str | None


def is_sharded(model: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in model.parameters())


def local(value: Any) -> Any:
    """A DTensor's local shard (a view of the same memory, without autograd); other values
    as they are."""
    return value.to_local().detach() if isinstance(value, DTensor) else value


def shard(model: nn.Module, mesh: Any, optimizer: torch.optim.Optimizer) -> None:
    """Shard ``model`` in place with ``fully_shard(model, mesh=mesh)`` (one group: the step
    gathers in buckets of its own) and point ``optimizer`` at the shards, by name."""
    from torch.distributed.fsdp import fully_shard

    if optimizer.state:
        raise GraphampError(
            "mesh=: the optimizer already has state; shard the model with fully_shard and "
            "load a sharded checkpoint instead (torch.distributed.checkpoint)"
        )
    names = {id(p): name for name, p in model.named_parameters()}
    unknown = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in names]
    if unknown:
        raise GraphampError(
            f"the optimizer holds a tensor of shape {tuple(unknown[0].shape)} that is not a "
            "parameter of the model"
        )
    fully_shard(model, mesh=mesh)
    sharded = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [sharded[names[id(p)]] for p in group["params"]]


def inspect(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    process_group: object,
    mesh: Any,
    grad_dtype: str | None,
) -> ShardedModel:
    """The sharded model's parameters, mesh and group, checked: every parameter a DTensor
    sharded on dimension 0 of one 1-D mesh, that mesh the one given (``mesh``) and covering
    the ranks of ``process_group``, the optimizer holding the shards, and ``grad_dtype`` the
    type FSDP2 reduces in, where it sets one."""
    params = dict(model.named_parameters())
    plain = [name for name, p in params.items() if not isinstance(p, DTensor)]
    if plain:
        raise GraphampError(
            f"parameter {plain[0]!r} is not sharded: call fully_shard on the modules that hold "
            "it (or give train_step the unsharded model and mesh=)"
        )
    sharded: dict[str, DTensor] = {n: p for n, p in params.items() if isinstance(p, DTensor)}
    meshes = {_mesh_key(p.device_mesh): p.device_mesh for p in sharded.values()}
    if len(meshes) > 1:
        raise GraphampError("the model's parameters are sharded on several meshes: use one")
    (model_mesh,) = meshes.values()
    for name, p in sharded.items():
        if model_mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
            raise GraphampError(
                f"parameter {name!r} is placed {tuple(p.placements)} on a {model_mesh.ndim}-D "
                "mesh: train_step shards dimension 0 over a 1-D mesh (FSDP's default; no HSDP)"
            )
        if p.dim() == 0:
            raise GraphampError(f"parameter {name!r} is a scalar: it cannot be sharded by rows")
    if (
        mesh is not None
        and mesh is not model_mesh
        and _ranks_of_mesh(mesh) != _ranks_of_mesh(model_mesh)
    ):
        raise GraphampError(
            f"mesh=: the model is sharded on a mesh of ranks {_ranks_of_mesh(model_mesh)}, "
            f"not the one given ({_ranks_of_mesh(mesh)})"
        )
    group = model_mesh.get_group()
    if process_group is not None:
        given = dist.group.WORLD if process_group == "world" else process_group
        if not isinstance(given, dist.ProcessGroup):
            raise GraphampError("process_group: a torch.distributed ProcessGroup or 'world'")
        if dist.get_process_group_ranks(given) != dist.get_process_group_ranks(group):
            raise GraphampError(
                f"process_group holds ranks {dist.get_process_group_ranks(given)} but the "
                f"model is sharded on a mesh of ranks {_ranks_of_mesh(model_mesh)}: pass the "
                "mesh's group (or no process_group)"
            )
    check_optimizer(optimizer, sharded)
    return ShardedModel(
        sharded,
        model_mesh,
        group.group_name,
        dist.get_world_size(group),
        dist.get_rank(group),
        _reduce_dtype(model, grad_dtype),
    )


def _mesh_key(mesh: Any) -> tuple:
    """What tells meshes apart: equal meshes may be distinct objects."""
    return mesh.device_type, tuple(mesh.mesh.shape), tuple(_ranks_of_mesh(mesh))


def _ranks_of_mesh(mesh: Any) -> list[int]:
    return [int(rank) for rank in mesh.mesh.flatten().tolist()]


def check_optimizer(optimizer: torch.optim.Optimizer, params: dict[str, DTensor]) -> None:
    """The optimizer must hold the model's shards: one built before ``fully_shard`` holds the
    whole tensors fully_shard replaced."""
    shards = {id(p) for p in params.values()}
    shapes = {tuple(p.shape) for p in params.values()}
    for index, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            if id(p) in shards:
                continue
            if not isinstance(p, DTensor) and tuple(p.shape) in shapes:
                raise GraphampError(
                    f"optimizer parameter group {index} holds a whole tensor of shape "
                    f"{tuple(p.shape)}, not the model's shard: the optimizer was built before "
                    "fully_shard; build it on the sharded model's parameters"
                )
            raise GraphampError(
                f"optimizer parameter group {index}: holds a tensor of shape "
                f"{tuple(p.shape)} that is not a parameter of the model"
            )


def _reduce_dtype(model: nn.Module, grad_dtype: str | None) -> str | None:
    """The type FSDP2's policies reduce gradients in (``reduce_dtype``, else ``param_dtype``),
    when the model's modules set one; refuses ``grad_dtype`` when it differs."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state

    found: dict[str, str] = {}
    for name, module in model.named_modules():
        state = _get_module_fsdp_state(module)
        policy = getattr(state, "_mp_policy", None)
        if policy is None:
            continue
        dtype = policy.reduce_dtype or policy.param_dtype
        if dtype is not None:
            found.setdefault(dtype_name(dtype), name or "the model")
    if len(found) > 1:
        raise GraphampError(
            "the model's FSDP2 MixedPrecisionPolicy reduces gradients in "
            f"{' and '.join(sorted(found))} in different modules: train_step uses one type"
        )
    reduce = next(iter(found), None)
    if grad_dtype is not None and reduce is not None and grad_dtype != reduce:
        raise GraphampError(
            f"grad_dtype={grad_dtype!r} but the model's FSDP2 MixedPrecisionPolicy reduces "
            f"gradients in {reduce} ({found[reduce]}): pass grad_dtype={reduce!r} or leave it out"
        )
    return reduce


def skeleton(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s module tree for capturing the forward pass: the original module
    classes with FSDP2's forward hooks gone, the buffers shared, and each parameter a fake
    tensor of the whole shape (no memory), tied parameters still tied."""
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    memo: dict[int, Any] = {}

    def whole(p: nn.Parameter) -> nn.Parameter:
        if id(p) not in memo:
            device = local(p).device if isinstance(p, DTensor) else p.device
            with fake:
                value = torch.empty(tuple(p.shape), dtype=p.dtype, device=device)
            memo[id(p)] = nn.Parameter(value, requires_grad=p.requires_grad)
        return memo[id(p)]

    def copy(module: nn.Module) -> nn.Module:
        if id(module) in memo:
            return memo[id(module)]
        cls = type(module)
        if cls.__name__.startswith("FSDP") and hasattr(cls, "_orig_cls_mro_index"):
            cls = cls.__mro__[cls._orig_cls_mro_index]
        clone = cls.__new__(cls)
        memo[id(module)] = clone
        state = dict(module.__dict__)
        for attribute in _FSDP_ATTRIBUTES:
            state.pop(attribute, None)
        fsdp_hooks = _fsdp_hook_ids(module)
        for hooks in _HOOK_DICTS:
            if hooks in state:
                state[hooks] = OrderedDict(
                    (key, hook) for key, hook in state[hooks].items() if key not in fsdp_hooks
                )
        state["_parameters"] = {
            name: None if p is None else whole(p) for name, p in module._parameters.items()
        }
        state["_buffers"] = dict(module._buffers)
        state["_modules"] = {
            name: None if child is None else copy(child) for name, child in module._modules.items()
        }
        clone.__dict__.update(state)
        return clone

    return copy(model)


def _fsdp_hook_ids(module: nn.Module) -> set[int]:
    """The ids of the forward hooks FSDP2 registered on ``module``."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state

    state = _get_module_fsdp_state(module)
    if state is None:
        return set()
    ids = set()
    for handle in (state._pre_forward_hook_handle, state._post_forward_hook_handle):
        for one in getattr(handle, "handles", (handle,)):
            if one is not None:
                ids.add(one.id)
    return ids


def as_dtensor(value: torch.Tensor, like: DTensor) -> DTensor:
    """``value`` (this rank's shard) as a DTensor sharded as ``like``, sharing its memory."""
    return DTensor.from_local(
        value, like.device_mesh, like.placements, shape=like.shape, stride=like.stride()
    )
