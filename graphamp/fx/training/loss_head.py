"""A cross-entropy loss head of an eager step computed a block of rows at a time.

A language model's loss over its vocabulary is traced as ``_log_softmax`` and
``nll_loss_forward`` in the forward and ``nll_loss_backward`` then
``_log_softmax_backward_data`` at the backward's start, each over the whole [rows, vocabulary]
matrix in float32 (a bfloat16 step casts the logits up first and the gradient down last). Run
op by op, that is four buffers of the whole matrix, two of them alive together at the step's
peak: BERT-base's masked-LM head over 30,522 words at batch 8 x 128 held the log-probabilities
and nll's gradient, 2 x 119 MiB, beside every saved activation (BENCHMARKS.md, History, issue
42). :func:`chunked` puts one :func:`cross_entropy_chunked` in their place, which runs the
same kernels on blocks of rows into buffers of a few MiB and writes the gradient in the
logits' own type: the values are the traced ops' bit for bit (every one of these kernels
computes a row from that row alone, and the loss is ``nll_loss_forward`` over the picked
log-probabilities in the rows' order, so its sum is the same), and the blocks stay in the
cache, which made the head 3-4x faster on this project's CPU.

The fused call needs the loss's gradient (the seed of the backward) before it computes the
loss; the traced seed reads the loss only for its shape and type (``ones_like``), so such a
read becomes a ``full`` of the same value. ``torch.compile`` gets the traced ops back
(:func:`unfused`): inductor fuses the head itself.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from graphamp.fx.dialect.ops import cast_type, tensor_value
from graphamp.fx.training.in_place import recompiled
from graphamp.fx.training.partition import ancestors

aten = torch.ops.aten
_VIEWS = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default})
# Ops that read only their input's shape, type and device: a seed made by one of them does not
# wait for the value it reads.
_LIKE = {
    aten.ones_like.default: 1.0,
    aten.zeros_like.default: 0.0,
}
_MEAN, _SUM = 1, 2  # torch's Reduction enum: the two that make a scalar loss
_HEAD_META = "graphamp_loss_head"  # on the fused node: the traced ops, for unfused
_BLOCK_ELEMENTS = 1 << 20  # elements of one block of rows (4 MiB in float32): fastest measured


def cross_entropy_chunked(
    logits: torch.Tensor,
    target: torch.Tensor,
    seed: torch.Tensor,
    reduction: int,
    ignore_index: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, total_weight, gradient)`` of ``nll_loss(log_softmax(logits.to(dtype)))`` over
    the last dimension (no class weights), the gradient of the loss scaled by ``seed`` with
    respect to ``logits``, in their shape and type: the traced ops' values, a block of rows
    at a time (see the module docstring)."""
    classes = logits.shape[-1]
    rows = logits.reshape(-1, classes)
    labels = target.reshape(-1)
    count = rows.shape[0]
    valid = labels != ignore_index
    # nll_loss_forward's own total weight without class weights: the rows not ignored
    total_weight = valid.sum().to(dtype=dtype)
    gradient = torch.empty_like(logits)
    gradient_rows = gradient.view(-1, classes)
    # the picked log-probabilities, in the column of a label that is not ignore_index
    column = 1 if ignore_index == 0 else 0
    picked = torch.zeros(count, 2, dtype=dtype, device=logits.device)
    block = max(1, _BLOCK_ELEMENTS // max(classes, 1))
    wide, log_probs, nll_gradient, wide_gradient = (
        torch.empty(min(block, count), classes, dtype=dtype, device=logits.device) for _ in range(4)
    )
    for start in range(0, count, block):
        stop = min(count, start + block)
        n = stop - start
        x, out, g, gx = wide[:n], log_probs[:n], nll_gradient[:n], wide_gradient[:n]
        x.copy_(rows[start:stop])
        aten._log_softmax.out(x, 1, False, out=out)
        labels_here = labels[start:stop]
        indices = labels_here.clamp(0, classes - 1).unsqueeze(1)
        picked[start:stop, column] = out.gather(1, indices).squeeze(1)
        aten.nll_loss_backward.grad_input(
            seed, out, labels_here, None, reduction, ignore_index, total_weight, grad_input=g
        )
        aten._log_softmax_backward_data.out(g, out, 1, dtype, out=gx)
        gradient_rows[start:stop].copy_(gx)
    # each row's label the picked column (or ignored): the same rows summed in the same order
    ignored = torch.full_like(labels, ignore_index)
    loss, total = aten.nll_loss_forward(
        picked,
        torch.where(valid, torch.full_like(labels, column), ignored),
        None,
        reduction,
        ignore_index,
    )
    return loss, total, gradient


def chunked(module: fx.GraphModule) -> int:
    """Put a :func:`cross_entropy_chunked` in place of each cross-entropy head of ``module``
    that has the traced form (see :func:`_match`); how many."""
    made = 0
    for backward in [n for n in module.graph.nodes if n.target is aten.nll_loss_backward.default]:
        head = _match(backward)
        if head is not None and _seed_before(module.graph, head):
            _fuse(module.graph, head)
            made += 1
    return recompiled(module, made)


@dataclass
class _Head:
    """The traced nodes of one head: ``source`` (the logits, in their type) through ``up``
    (views and at most one cast) to the log-softmax, the nll forward and its items, the
    backward pair, then ``down`` (views and at most one cast) to the gradient of ``source``."""

    source: fx.Node
    up: list[fx.Node]
    log_softmax: fx.Node
    forward: fx.Node
    items: dict[int, fx.Node]
    backward: fx.Node
    log_softmax_backward: fx.Node
    down: list[fx.Node]


def _match(backward: fx.Node) -> _Head | None:
    """The head ``backward`` (an ``nll_loss_backward``) ends, where every node of it but the
    source and ``end`` is read only inside the head, the classes are the last dimension of a
    contiguous source, there are no class weights and the loss is a scalar (mean or sum)."""
    seed, log_softmax, target, weight, reduction, ignore_index, total_weight = backward.args
    if weight is not None or reduction not in (_MEAN, _SUM) or not isinstance(seed, fx.Node):
        return None
    if not isinstance(log_softmax, fx.Node) or log_softmax.target is not aten._log_softmax.default:
        return None
    wide, dim, half_to_float = log_softmax.args
    value = tensor_value(wide)
    if (
        not isinstance(wide, fx.Node)
        or half_to_float
        or value is None
        or value.dim() != 2
        or dim not in (1, -1)
    ):
        return None
    if not isinstance(total_weight, fx.Node) or total_weight.target is not operator.getitem:
        return None
    forward = total_weight.args[0]
    if (
        not isinstance(forward, fx.Node)
        or forward.target is not aten.nll_loss_forward.default
        or forward.args
        != (
            log_softmax,
            target,
            None,
            reduction,
            ignore_index,
        )
    ):
        return None
    items = {
        user.args[1]: user
        for user in forward.users
        if user.target is operator.getitem and isinstance(user.args[1], int)
    }
    if len(items) != len(forward.users) or len(backward.users) != 1:
        return None
    (pair,) = backward.users
    if pair.target is not aten._log_softmax_backward_data.default or pair.args != (
        backward,
        log_softmax,
        dim,
        value.dtype,
    ):
        return None
    if set(log_softmax.users) != {forward, backward, pair}:
        return None
    up = _chain_up(wide)
    source = up[0].args[0] if up else wide
    if not isinstance(source, fx.Node):
        return None
    down = _chain_down(pair, tensor_value(source))
    if down is None:
        return None
    return _Head(source, up, log_softmax, forward, items, backward, pair, down)


def _chain_up(wide: fx.Node) -> list[fx.Node]:
    """The views and at most one widening cast, each read by the next alone, that make the
    log-softmax's input from the logits: first node first (empty: the input is the logits)."""
    chain: list[fx.Node] = []
    node = wide
    casts = 0
    while (node.target in _VIEWS or _is_cast(node)) and len(node.users) == 1:
        casts += _is_cast(node)
        if casts > 1 or not isinstance(node.args[0], fx.Node):
            break
        chain.insert(0, node)
        node = node.args[0]
    # the logits must hold the rows in order: a contiguous tensor, classes last
    source = chain[0].args[0] if chain else wide
    value, logits = tensor_value(wide), tensor_value(source)
    if logits is None or value is None or not logits.is_contiguous():
        return []
    if logits.shape[-1] != value.shape[-1] or logits.numel() != value.numel():
        return []
    return chain


def _chain_down(pair: fx.Node, logits: torch.Tensor | None) -> list[fx.Node] | None:
    """The views and at most one cast from the log-softmax's gradient down to the first node
    of the same shape and type as ``logits`` (its gradient: the fused call rounds once, as
    one cast does), each read by the next alone but that one; None where there is none."""
    if logits is None:
        return None
    chain: list[fx.Node] = []
    node = pair
    while True:
        value = tensor_value(node)
        if value is not None and value.shape == logits.shape and value.dtype == logits.dtype:
            return chain
        if len(node.users) != 1:
            return None
        (user,) = node.users
        if not (user.target in _VIEWS or _is_cast(user)) or user.args[0] is not node:
            return None
        if _is_cast(user) and any(map(_is_cast, chain)):
            return None
        chain.append(user)
        node = user


def _is_cast(node: fx.Node) -> bool:
    """A ``_to_copy`` that changes only the type (:func:`cast_type`)."""
    return cast_type(node) is not None


def _seed_before(graph: fx.Graph, head: _Head) -> bool:
    """Whether the backward's seed can be computed before the loss: each read of the loss (or
    of a value made from it) the seed makes only for its shape and type (``ones_like``)
    becomes a ``full`` of the same value; False, and the graph unchanged, where the seed
    reads the loss otherwise."""
    seed = head.backward.args[0]
    if not isinstance(seed, fx.Node):
        return False
    loss_values = {head.forward, *head.items.values()}
    likes = frozenset(
        node
        for node in ancestors(seed)
        if node.target in _LIKE and tensor_value(node) is not None and ancestors(node) & loss_values
    )
    # what the seed reads past the reads the rewrite removes (none: the seed itself is one)
    reached = set() if seed in likes else ancestors(seed, stop=likes) - likes
    if seed in loss_values or reached & loss_values:
        return False
    for like in likes:
        value = tensor_value(like)
        assert value is not None
        with graph.inserting_before(like):
            full = graph.call_function(
                aten.full.default,
                (list(value.shape), _LIKE[like.target]),  # type: ignore[index]
                {"dtype": value.dtype, "device": value.device},
            )
        full.meta["val"] = value
        like.replace_all_uses_with(full)
        graph.erase_node(like)
    return True


def _fuse(graph: fx.Graph, head: _Head) -> None:
    """Replace ``head``'s traced nodes with one :func:`cross_entropy_chunked` where the
    backward was, and move after it what read the loss before it."""
    seed, _, target, _, reduction, ignore_index, _ = head.backward.args
    end = head.down[-1] if head.down else head.log_softmax_backward
    log_probs = tensor_value(head.log_softmax)
    assert log_probs is not None
    with graph.inserting_before(head.backward):
        fused = graph.call_function(
            cross_entropy_chunked,
            (head.source, target, seed, reduction, ignore_index, log_probs.dtype),
        )
    loss_val, total_val = head.forward.meta["val"]
    fused.meta["val"] = (loss_val, total_val, end.meta["val"])
    fused.meta[_HEAD_META] = _record(head)
    # what read the loss between the forward and the backward runs after the fused call
    order = {node: index for index, node in enumerate(graph.nodes)}
    loss_values = {head.forward, *head.items.values()}
    after = fused
    for node in list(graph.nodes):
        between = order[head.forward] < order[node] < order[fused]
        if between and node not in loss_values and ancestors(node) & loss_values:
            after.append(node)
            after = node
    with graph.inserting_after(fused):
        gradient = graph.call_function(operator.getitem, (fused, 2))
    gradient.meta["val"] = end.meta["val"]
    end.replace_all_uses_with(gradient)
    for node in [*reversed(head.down), head.log_softmax_backward, head.backward]:
        graph.erase_node(node)
    for index, item in sorted(head.items.items()):
        if item.users:
            with graph.inserting_after(fused):
                new = graph.call_function(operator.getitem, (fused, index))
            new.meta = dict(item.meta)
            item.replace_all_uses_with(new)
        graph.erase_node(item)
    for node in [head.forward, head.log_softmax, *reversed(head.up)]:
        graph.erase_node(node)


def _record(head: _Head) -> dict[str, Any]:
    """What :func:`unfused` needs to write the traced nodes again: each chain node's op,
    arguments after the first, keyword arguments and value."""

    def ops(chain: list[fx.Node]) -> list[tuple[Any, tuple[Any, ...], dict[str, Any], Any]]:
        return [(n.target, tuple(n.args[1:]), dict(n.kwargs), n.meta.get("val")) for n in chain]

    return {
        "up": ops(head.up),
        "down": ops(head.down),
        "dim": head.log_softmax.args[1],
        "vals": {
            "log_softmax": head.log_softmax.meta.get("val"),
            "forward": head.forward.meta.get("val"),
            "backward": head.backward.meta.get("val"),
            "pair": head.log_softmax_backward.meta.get("val"),
        },
    }


def unfused(module: fx.GraphModule) -> int:
    """``module`` with each :func:`cross_entropy_chunked` of :func:`chunked` written as the
    traced ops again, where it stands; how many."""
    graph = module.graph
    made = 0
    for fused in [n for n in graph.nodes if n.target is cross_entropy_chunked]:
        record = fused.meta[_HEAD_META]
        source, target, seed, reduction, ignore_index, _ = fused.args
        vals = record["vals"]

        def call(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], val: Any) -> fx.Node:
            node = graph.call_function(op, args, kwargs)
            node.meta["val"] = val
            return node

        with graph.inserting_before(fused):
            node = source
            for op, rest, kwargs, val in record["up"]:
                node = call(op, (node, *rest), kwargs, val)
            log_softmax = call(
                aten._log_softmax.default, (node, record["dim"], False), {}, vals["log_softmax"]
            )
            forward = call(
                aten.nll_loss_forward.default,
                (log_softmax, target, None, reduction, ignore_index),
                {},
                vals["forward"],
            )
            loss = call(operator.getitem, (forward, 0), {}, vals["forward"][0])
            total_weight = call(operator.getitem, (forward, 1), {}, vals["forward"][1])
            backward = call(
                aten.nll_loss_backward.default,
                (seed, log_softmax, target, None, reduction, ignore_index, total_weight),
                {},
                vals["backward"],
            )
            node = call(
                aten._log_softmax_backward_data.default,
                (backward, log_softmax, record["dim"], vals["log_softmax"].dtype),
                {},
                vals["pair"],
            )
            for op, rest, kwargs, val in record["down"]:
                node = call(op, (node, *rest), kwargs, val)
        by_index = {0: loss, 1: total_weight, 2: node}
        for item in list(fused.users):
            item.replace_all_uses_with(by_index[item.args[1]])
            graph.erase_node(item)
        graph.erase_node(fused)
        made += 1
    return recompiled(module, made)
