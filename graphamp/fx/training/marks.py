"""Marks: identity ops that name what a value is in a traced training step.

The step is traced with ``mark(loss, "loss")``, ``mark(seed, "grad_seed")``,
``mark(gradient, "gradient")`` and ``mark_update(new, old)`` around the values the training
passes work on (and, in a sharded step, ``scattered(gradient, rows)`` where the optimizer
reads a shard of a whole gradient). :func:`strip` removes them from the traced graph and
returns what they marked, so the reader can give those values their
:class:`~graphamp.core.graph.Role`.
"""

from __future__ import annotations

import torch
from torch import fx

from graphamp.core.graph import Role
from graphamp.errors import InternalError


@torch.library.custom_op("graphamp::mark", mutates_args=())
def mark(value: torch.Tensor, role: str) -> torch.Tensor:
    return value.clone()


@mark.register_fake
def _(value: torch.Tensor, role: str) -> torch.Tensor:
    return torch.empty_like(value)


@torch.library.custom_op("graphamp::mark_update", mutates_args=())
def mark_update(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return new.clone()


@mark_update.register_fake
def _(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(new)


@torch.library.custom_op("graphamp::scattered", mutates_args=())
def scattered(whole: torch.Tensor, rows: int) -> torch.Tensor:
    """A whole gradient where the optimizer reads this rank's shard of it (``rows`` rows): a
    sharded step's trace only. :func:`strip` leaves the whole gradient in its place, which the
    ``reduce_scatter`` pass turns into the shard."""
    raise InternalError("graphamp::scattered is a mark for tracing a sharded step; it never runs")


@scattered.register_fake
def _(whole: torch.Tensor, rows: int) -> torch.Tensor:
    return whole.new_empty((rows, *whole.shape[1:]))


def _mark_backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    return grad, None


# The loss is marked inside the differentiated function: its gradient passes through unchanged.
mark.register_autograd(_mark_backward)

MARK_OPS = (
    torch.ops.graphamp.mark.default,
    torch.ops.graphamp.mark_update.default,
    torch.ops.graphamp.scattered.default,
)


def strip(module: fx.GraphModule) -> dict[str, tuple[Role, str | None]]:
    """Remove every mark from ``module``'s graph; returns, by fx node name of the marked
    value, its role and (for updates) the name of the value it replaces."""
    roles: dict[str, tuple[Role, str | None]] = {}
    graph = module.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in MARK_OPS:
            continue
        value = node.args[0]
        assert isinstance(value, fx.Node)
        if node.target is MARK_OPS[0]:
            roles[value.name] = (Role(node.args[1]), None)
        elif node.target is MARK_OPS[1]:
            old = node.args[1]
            assert isinstance(old, fx.Node)
            roles[value.name] = (Role.UPDATE, old.name)
        # (a scattered gradient's role comes from the gradient mark on it)
        node.replace_all_uses_with(value)
        graph.erase_node(node)
    graph.lint()
    module.recompile()
    return roles
