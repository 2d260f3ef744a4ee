"""Building the nodes the training passes add, in aten ops.

Each node kind has a small function over tensors; it is traced with ``make_fx`` (on fake
tensors of the inputs' shapes and types) and its graph copied into the step graph right after
the last of its inputs, so the step stays one graph of aten ops that ``torch.compile`` fuses.
Two nodes are exceptions, each one call of a function that an eager step runs faster than the
traced ops: the step guard (:func:`select_on_host` chooses on the host in an eager CPU step)
and the finite check (:func:`any_non_finite`, GradScaler's fused kernel); for
``torch.compile`` both become their traced ops (:func:`with_traced_guards`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from graphamp.core.graph import NodeKind, OpNode
from graphamp.errors import InternalError
from graphamp.fx.dialect import collectives, float8_lowering
from graphamp.fx.dialect.types import torch_dtype
from graphamp.training.scaling import DynamicLossScaling

Lowering = Callable[..., Sequence[torch.Tensor] | torch.Tensor]


def _loss_scale(node: OpNode) -> Lowering:
    def scaled_seed(seed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return seed * scale

    return scaled_seed


def _unscale(node: OpNode) -> Lowering:
    def unscaled(scale: torch.Tensor, *gradients: torch.Tensor) -> list[torch.Tensor]:
        inverse = (1.0 / scale.double()).float()  # the reciprocal rounded once, as GradScaler
        return [gradient * inverse for gradient in gradients]

    return unscaled


def non_finite(*gradients: torch.Tensor) -> torch.Tensor:
    """The finite check as ``torch.compile`` sees it: true when any gradient holds inf or
    NaN."""
    # A tensor holds inf or NaN exactly when its largest or smallest element is one (max and
    # min propagate NaN): two reductions that write nothing, where abs().amax() wrote a
    # temporary as large as the gradient and isfinite(x).all() takes five passes. (x * 0
    # would take one, but compilers rightly fold it to 0.)
    extremes = [e for g in gradients for e in (g.amax(), g.amin())]
    return ~torch.stack(extremes).isfinite().all()


_ONE = torch.ones(())


def reads_on_host(flag: torch.Tensor | bool) -> bool:
    """Whether an eager step reads ``flag`` (the finite check's result, the loss scale's
    inverse) on the host to decide: on a CPU, where the value already is, or once read there
    (:func:`read_on_host`, a Python bool); else the step decides on the device
    (``torch.where``, updates out of place)."""
    return isinstance(flag, bool) or flag.device.type == "cpu"


def read_on_host(found_inf: torch.Tensor) -> bool:
    """The finite check's result read on the host, once, for the step guards that follow: on
    a GPU one wait for the device's queue, as ``GradScaler.step`` waits (``found_inf.item()``),
    after which the guards update in place and pick the kept or the new values on the host,
    where deciding on the device costs a ``torch.where`` over every parameter and optimizer
    state and a copy back (:mod:`graphamp.fx.training.in_place`, ``guards_read_once``)."""
    return bool(found_inf)


def unscale_and_check(inverse: torch.Tensor, *gradients: torch.Tensor) -> torch.Tensor:
    """The unscale and the finite check as an eager step runs them when it may write into
    the gradients (:func:`graphamp.fx.training.in_place.unscale_in_check`): each gradient multiplied
    by ``inverse`` in place, and true when any unscaled gradient holds inf or NaN; one call of
    GradScaler's fused kernel, where tensors it can take. The kernel checks the scaled
    values, which decides alike while the scale is at least 1 (an inverse of at most 1 keeps
    a finite value finite). Below 1 (GradScaler's defaults have no floor) a large finite
    gradient could overflow as it is unscaled: on a CPU the step then checks the unscaled
    values as the traced graph does; elsewhere, where reading the scale would wait for the
    device, it decides as GradScaler does."""
    if not _fusable(gradients) or (reads_on_host(inverse) and bool(inverse > 1)):
        for gradient in gradients:
            gradient.mul_(inverse)
        return non_finite(*gradients)
    return _fused_check(gradients, inverse)


def _fusable(gradients: Sequence[torch.Tensor]) -> bool:
    """Whether GradScaler's fused kernel takes ``gradients``: contiguous floating-point
    tensors on one device (not a broadcast view, whose elements share memory)."""
    device = gradients[0].device
    return all(
        g.is_contiguous() and g.is_floating_point() and g.device == device for g in gradients
    )


def any_non_finite(*gradients: torch.Tensor) -> torch.Tensor:
    """The finite check as an eager step runs it: GradScaler's fused kernel
    (``_amp_foreach_non_finite_check_and_unscale_``, here with a scale of one, which writes
    every value back unchanged): one call and one pass over all gradients, where
    :func:`non_finite` dispatches two reductions per gradient and a stack. Tensors the kernel
    cannot take (not contiguous, not floating point, on several devices) get
    :func:`non_finite`. ``TrainStep.compile`` swaps it for :func:`non_finite`'s ops
    (:func:`with_traced_guards`)."""
    if not _fusable(gradients):
        return non_finite(*gradients)
    device = gradients[0].device
    one = _ONE if device.type == "cpu" else torch.ones((), device=device)  # no host copy
    return _fused_check(gradients, one)


def _fused_check(gradients: Sequence[torch.Tensor], inverse: torch.Tensor) -> torch.Tensor:
    """GradScaler's kernel over ``gradients``: each multiplied by ``inverse`` in place, and
    whether any held inf or NaN before."""
    flag = torch.zeros((), device=gradients[0].device)
    torch._amp_foreach_non_finite_check_and_unscale_(list(gradients), flag, inverse)
    return flag > 0


def select_on_host(
    found_inf: torch.Tensor | bool, *old_and_new: torch.Tensor
) -> list[torch.Tensor]:
    """The step guard as an eager step runs it: where the finite check is read on the host (a
    CPU's tensor; on a GPU the Python bool :func:`read_on_host` made, once a step), the old
    values or the new ones chosen there, not a ``torch.where`` over every parameter and
    optimizer state (a third of a small CPU step's time); given a device's tensor,
    ``torch.where``, which never waits for the device. Either way the values are exactly the
    ones kept or computed. ``TrainStep.compile`` swaps it for the traced
    ``torch.where`` (:func:`with_traced_guards`), which inductor fuses."""
    pairs = list(zip(old_and_new[0::2], old_and_new[1::2], strict=True))
    if not isinstance(found_inf, bool) and not reads_on_host(found_inf):
        return [torch.where(found_inf, old, new) for old, new in pairs]
    skipped = bool(found_inf)
    return [old if skipped else new for old, new in pairs]


def _build_guard(graph: fx.Graph, inputs: list[fx.Node], anchor: fx.Node) -> list[fx.Node]:
    """The step guard (a STEP_GUARD node) as one call of :func:`select_on_host`."""
    with graph.inserting_before(anchor):
        select = graph.call_function(select_on_host, tuple(inputs))
        outputs = []
        for index, new in enumerate(inputs[2::2]):
            picked = graph.call_function(operator.getitem, (select, index))
            picked.meta["val"] = new.meta.get("val")
            outputs.append(picked)
    return outputs


def _build_check(graph: fx.Graph, inputs: list[fx.Node], anchor: fx.Node) -> list[fx.Node]:
    """The finite check (a FINITE_CHECK node) as one call of :func:`any_non_finite`."""
    with graph.inserting_before(anchor):
        check = graph.call_function(any_non_finite, tuple(inputs))
    check.meta["val"] = torch.tensor(False)
    return [check]


def with_traced_guards(module: fx.GraphModule) -> fx.GraphModule:
    """``module`` with every :func:`select_on_host` made ``torch.where`` nodes and every
    :func:`any_non_finite` :func:`non_finite`'s ops: what ``torch.compile`` should see (no
    data-dependent branch, no op writing its inputs; it fuses the selection and the check)."""
    graph = module.graph
    changed = False
    for check in [n for n in graph.nodes if n.target is any_non_finite]:
        gradients = [g for g in check.args if isinstance(g, fx.Node)]  # in order, repeats kept
        (result,) = _copy_traced(graph, non_finite, gradients, check)
        check.replace_all_uses_with(result)
        graph.erase_node(check)
        changed = True
    for select in [n for n in graph.nodes if n.target is select_on_host]:
        found_inf, *old_and_new = select.args
        for picked in list(select.users):
            index = picked.args[1]
            old, new = old_and_new[2 * index], old_and_new[2 * index + 1]
            with graph.inserting_before(picked):
                where = graph.call_function(torch.ops.aten.where.self, (found_inf, old, new))
            where.meta = dict(picked.meta)
            picked.replace_all_uses_with(where)
            graph.erase_node(picked)
        graph.erase_node(select)
        changed = True
    if changed:
        graph.lint()
        module.recompile()
    return module


def _skip_count(node: OpNode) -> Lowering:
    def next_count(skipped: torch.Tensor, found_inf: torch.Tensor) -> torch.Tensor:
        return skipped + found_inf.to(skipped.dtype)

    return next_count


def _scale_update(node: OpNode) -> Lowering:
    params = dict(node.params)
    scaling = DynamicLossScaling(
        init_loss_scaling=float(params["init_loss_scaling"]),
        incr_every_n_steps=int(params["incr_every_n_steps"]),
        decr_every_n_nan_or_inf=int(params["decr_every_n_nan_or_inf"]),
        incr_ratio=float(params["incr_ratio"]),
        decr_ratio=float(params["decr_ratio"]),
        min_loss_scaling=float(params["min_loss_scaling"]),
    )

    def next_state(
        found_inf: torch.Tensor, scale: torch.Tensor, good: torch.Tensor, bad: torch.Tensor
    ) -> list[torch.Tensor]:
        state = scaling.update({"scale": scale, "good": good, "bad": bad}, found_inf)
        return [state["scale"], state["good"], state["bad"]]

    return next_state


def _all_reduce(node: OpNode) -> Lowering:
    # Functional collectives trace into the graph as _c10d_functional ops on the group's name.
    from torch.distributed import _functional_collectives as collectives
    from torch.distributed.distributed_c10d import GroupName

    group, world = GroupName(str(node.params["group"])), int(node.params["world_size"])
    if node.params["op"] == "max":

        def largest(flag: torch.Tensor) -> torch.Tensor:
            # gloo reduces no bool: the flag travels as an int32 0 or 1.
            sent = flag.to(torch.int32).reshape(1)
            return collectives.wait_tensor(collectives.all_reduce(sent, "max", group))[0] > 0

        return largest
    sent_as = torch_dtype(str(node.params["dtype"]))

    def mean(*gradients: torch.Tensor) -> list[torch.Tensor]:
        # One flat buffer per bucket, divided by the world size before it is narrowed (as
        # fp16_compress_hook does): the sum of the ranks' shares is the mean.
        flat = torch.cat([g.reshape(-1) for g in gradients]) * (1.0 / world)
        # Summed in place: the buffer is this node's own (cat copies), and a new result buffer
        # per step would cost as much as the reduction on a CPU (fresh pages).
        sent = flat.to(sent_as)
        reduce_in_place = torch.ops._c10d_functional.all_reduce_
        summed = collectives.wait_tensor(reduce_in_place(sent, "sum", group))
        pieces = summed.split([g.numel() for g in gradients])
        # Widened piece by piece: each gradient is then a tensor of its own, which the unscale
        # that follows may update in place (graphamp.fx.training.in_place); a view of one buffer is
        # not.
        dtype = gradients[0].dtype
        return [p.view(g.shape).to(dtype) for p, g in zip(pieces, gradients, strict=True)]

    return mean


def _clip_grad_norm(node: OpNode) -> Lowering:
    max_norm, norm_type = float(node.params["max_norm"]), float(node.params["norm_type"])

    group = node.params.get("group")  # a sharded step: each rank holds a part of the norm

    def clipped(*gradients: torch.Tensor) -> list[torch.Tensor]:
        # torch.nn.utils.clip_grad_norm_'s arithmetic: the norm of the per-tensor norms.
        norms = torch.stack([torch.linalg.vector_norm(g, norm_type) for g in gradients])
        total = torch.linalg.vector_norm(norms, norm_type)
        if group is not None and norm_type == math.inf:
            total = collectives.over_ranks(total, "max", str(group))
        elif group is not None:
            total = collectives.over_ranks(total**norm_type, "sum", str(group)) ** (1 / norm_type)
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        return [g * coefficient for g in gradients]

    return clipped


LOWERINGS: dict[NodeKind, Callable[[OpNode], Lowering]] = {
    NodeKind.LOSS_SCALE: _loss_scale,
    NodeKind.UNSCALE: _unscale,
    NodeKind.SKIP_COUNT: _skip_count,
    NodeKind.SCALE_UPDATE: _scale_update,
    NodeKind.ALL_REDUCE: _all_reduce,
    NodeKind.CLIP_GRAD_NORM: _clip_grad_norm,
    NodeKind.ALL_GATHER: collectives.all_gather,
    NodeKind.REDUCE_SCATTER: collectives.reduce_scatter,
    **float8_lowering.LOWERINGS,
}


BUILT_AS_CALLS = (NodeKind.STEP_GUARD, NodeKind.FINITE_CHECK)


def build(graph: fx.Graph, node: OpNode, values: dict[str, fx.Node]) -> None:
    """Add ``node`` to ``graph`` in aten ops; its outputs join ``values`` by name."""
    if node.kind not in LOWERINGS and node.kind not in BUILT_AS_CALLS:
        raise InternalError(f"the FX dialect cannot build a {node.kind.value} node")
    inputs = [values[name] for name in node.inputs]
    order = {n: index for index, n in enumerate(graph.nodes)}
    last = max(inputs, key=order.__getitem__)
    body = next(n for n in graph.nodes if n.op not in ("placeholder", "get_attr"))
    anchor = body if last.op in ("placeholder", "get_attr") else last.next
    if node.kind is NodeKind.STEP_GUARD:
        outputs = _build_guard(graph, inputs, anchor)
    elif node.kind is NodeKind.FINITE_CHECK:
        outputs = _build_check(graph, inputs, anchor)
    else:
        outputs = _copy_traced(graph, LOWERINGS[node.kind](node), inputs, anchor)
    for name, output in zip(node.outputs, outputs, strict=True):
        values[name] = output


def _copy_traced(
    graph: fx.Graph, function: Lowering, inputs: list[fx.Node], anchor: fx.Node
) -> list[fx.Node]:
    """``function`` traced with ``make_fx`` on fake tensors like ``inputs`` and copied into
    ``graph`` before ``anchor``, reading ``inputs``; its outputs."""
    traced = make_fx(function, tracing_mode="fake")(*(_example(value) for value in inputs))
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    with graph.inserting_before(anchor):
        result = graph.graph_copy(traced.graph, dict(zip(placeholders, inputs, strict=True)))
    outputs = list(result) if isinstance(result, tuple | list) else [result]
    nodes = [value for value in outputs if isinstance(value, fx.Node)]
    if len(nodes) != len(outputs):
        raise InternalError(f"a traced lowering returned {outputs!r}, not values")
    return nodes


def _example(value: fx.Node) -> torch.Tensor:
    """A tensor of the value's shape and type, for tracing a lowering."""
    meta = value.meta.get("val")
    if not isinstance(meta, torch.Tensor):
        raise InternalError(f"no shape and type known for {value.name!r}")
    return torch.empty(meta.shape, dtype=meta.dtype)
