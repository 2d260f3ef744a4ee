"""A training step sharded over a device mesh (FSDP): parameters, gradients and optimizer
state split across the ranks, the whole parameters only inside the step graph.

The model is sharded by FSDP2 (``fully_shard``, by the user or by ``train_step(mesh=...)``):
each parameter a DTensor whose local tensor holds this rank's rows. The step keeps no copy of
them: its graph reads and updates the model's own shards. The forward pass is converted from
a skeleton of the model whose parameters are fake tensors of the whole shapes
(:func:`graphamp.fx.distributed.fsdp.skeleton`), and the step is traced on fake tensors too, with
the whole parameters as graph inputs of their own (the ``whole_parameters`` option) and each
gradient marked where the optimizer reads its shard (:func:`graphamp.fx.training.marks.scattered`).
The
``step`` pipeline's ``all_gather`` and ``reduce_scatter`` passes
(:mod:`graphamp.passes.shard`) then put the collectives in as decisions of the plan, and the
MAX all-reduce of ``found_inf`` makes the ranks agree on skipping a step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from graphamp.errors import GraphampError
from graphamp.fx.distributed import data_parallel, fsdp
from graphamp.fx.training import differentiate, marks, optim
from graphamp.fx.training.step import TrainStep
from graphamp.passes.options import Options
from graphamp.training.distributed import DEFAULT_BUCKET_BYTES, DEFAULT_FIRST_BUCKET_BYTES, Sharding


def sharding_of(
    sharded: fsdp.ShardedModel, grad_dtype: str | None, bucket_bytes: int | None
) -> Sharding:
    """The settings the sharded step's passes read, for ``sharded``'s process group."""
    if grad_dtype is not None:
        dtype, source = grad_dtype, "grad_dtype"
    elif sharded.reduce_dtype is not None:
        dtype, source = sharded.reduce_dtype, "the model's FSDP2 MixedPrecisionPolicy"
    else:
        dtype, source = "float32", "grad_dtype None"
    return Sharding(
        group=sharded.group,
        world_size=sharded.world_size,
        rank=sharded.rank,
        dtype=dtype,
        dtype_source=source,
        bucket_bytes=DEFAULT_BUCKET_BYTES if bucket_bytes is None else bucket_bytes,
        first_bucket_bytes=DEFAULT_FIRST_BUCKET_BYTES if bucket_bytes is None else None,
    )


class ShardedTrainStep(TrainStep):
    """``step(*batch) -> loss`` on this rank's share of the batch, as :class:`TrainStep`;
    ``step.params`` and ``step.opt_state`` hold this rank's shards (``params`` are the
    model's own local tensors, trained in place)."""

    # Its graphs return new shards, which __call__ copies into the model's own; the whole
    # parameters' arguments sit between the shards and the optimizer state.
    write_back = False
    # A float8 layer quantises the weight's low-type copy: the whole weights are gathered in
    # the low type (half of float32's bytes), as FSDP2 gathers a MixedPrecisionPolicy's
    # param_dtype and torchao's Float8Linear quantises that.
    float8_weights = "low"

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[..., torch.Tensor],
        optimizer: torch.optim.Optimizer,
        policy: Any,
        loss_scaling: Any,
        accumulate: int,
        overrides: dict[str, Any],
        *,
        sharded: fsdp.ShardedModel,
        sharding: Sharding,
        clipping: Any = None,
        fp8: Any = None,
        recompute_casts: bool | None = None,
    ) -> None:
        if accumulate != 1:
            raise GraphampError(
                "accumulate: a sharded step updates on every batch (accumulate=1); "
                "accumulating sharded gradients is not built yet"
            )
        super().__init__(
            model,
            loss_fn,
            optimizer,
            policy,
            loss_scaling,
            accumulate,
            overrides,
            None,
            clipping,
            fp8,
            recompute_casts=recompute_casts,
        )
        self.sharded, self.sharding = sharded, sharding
        self._skeleton: nn.Module | None = None
        self._wholes: dict[str, torch.Tensor] = {}

    # what differs from a replicated step ----------------------------------------------------

    def _source(self) -> nn.Module:
        if self._skeleton is None:
            self._skeleton = fsdp.skeleton(self.model)
        return self._skeleton

    def _own_params(self) -> dict[str, torch.Tensor]:
        # The model's shards themselves: the step updates them (in place, or copied back after
        # the call), so the model, its state_dict and a checkpoint always hold the trained ones.
        self._model_params = {name: fsdp.local(p) for name, p in self.sharded.params.items()}
        return dict(self._model_params)

    def _trace(self, fn: Callable[..., list[torch.Tensor]], batch: Sequence) -> fx.GraphModule:
        """``fn`` traced on fake tensors: the shards and state as they are, and the whole
        parameters (after the shards) with their whole shapes, which no rank allocates."""
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        state = [mode.from_tensor(t) for t in self._flatten()]
        wholes = list(self._fake_wholes(mode).values())
        rest = [mode.from_tensor(t) for t in self._learning_rates()]
        fakes = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in batch]
        count = len(self.params)
        args = [*state[:count], *wholes, *state[count:], *rest, *fakes]
        traced = make_fx(differentiate.functionalize(self.forward, fn), tracing_mode="fake")(*args)
        return differentiate.without_leaf_detaches(traced)

    def _probe_arguments(
        self, batch: Sequence[torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], list[Any], bool]:
        # the whole parameters, as fake tensors: no rank allocates them
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        tensors = {
            **self._fake_wholes(mode),
            **{n: mode.from_tensor(b) for n, b in self.buffers.items()},
        }
        fakes = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in batch]
        return tensors, fakes, True

    def _fake_wholes(self, mode: FakeTensorMode) -> dict[str, torch.Tensor]:
        """The whole parameters as fake tensors of ``mode``: no rank allocates them."""
        with mode:
            return {
                n: torch.empty(tuple(self.sharded.params[n].shape), dtype=p.dtype, device=p.device)
                for n, p in self.params.items()
            }

    def _options(self, traced: fx.GraphModule) -> Options:
        shards, wholes = self._placeholders(traced)
        named = zip(wholes, zip(shards, self.params, strict=True), strict=True)
        return dataclasses.replace(
            super()._options(traced), shard=self.sharding, whole_parameters=dict(named)
        )

    def _placeholders(self, traced: fx.GraphModule) -> tuple[list[str], list[str]]:
        """The names of ``traced``'s shard and whole-parameter placeholders."""
        names = [n.name for n in traced.graph.nodes if n.op == "placeholder"]
        count = len(self.params)
        return names[:count], names[count : 2 * count]

    def _schedule(self, module: fx.GraphModule) -> None:
        data_parallel.schedule_collectives(module)

    def _update_fn(self, *args: torch.Tensor) -> list[torch.Tensor]:
        count = len(self.params)
        self._wholes = dict(zip(self.params, args[count : 2 * count], strict=True))
        return super()._update_fn(*args[:count], *args[2 * count :])

    def _gradients(
        self, params: dict[str, torch.Tensor], batch: Sequence[torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return super()._gradients(self._wholes, batch)  # forward and backward: whole ones

    def _as_read(self, gradient: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        return marks.scattered(gradient, param.shape[0])

    # use ----------------------------------------------------------------------------------

    def copy_to(self, model: nn.Module | None = None) -> None:
        """Write the optimizer state into the optimizer (DTensors sharded as the parameters,
        in torch.optim's layout: ``torch.distributed.checkpoint`` saves it with the model's
        state_dict) and the buffers into the model. The parameters are the model's already."""
        if model is not None and model is not self.model:
            raise GraphampError(
                "copy_to: a sharded step trains the model it was given in place; it writes "
                "into no other"
            )
        if self.graph is None:
            return
        state = {
            key: value if key == "step" else fsdp.as_dtensor(value, self._param_of(key))
            for key, value in self.opt_state.items()
        }
        optim.export_state(self.kind, self.groups, state, self.optimizer, self.model)
        own = dict(self.model.named_buffers())
        with torch.no_grad():
            for name, value in self.buffers.items():
                own[name].copy_(value)

    def _param_of(self, key: str) -> Any:
        """The DTensor parameter an optimizer state key (``exp_avg:0.weight``) belongs to."""
        return self.sharded.params[key.split(":", 1)[1]]
