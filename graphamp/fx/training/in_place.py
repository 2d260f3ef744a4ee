"""Elementwise ops of an eager step graph made in place where their first operand dies.

A traced step is functional: every unscale, momentum and moment update writes a new tensor as
large as a parameter. Run op by op on a CPU, each of those is a fresh buffer whose pages are
written for the first time (the page faults cost more than the arithmetic), where
``torch.optim`` and ``GradScaler`` update their tensors in place. Here an op like ``mul(a, b)``
becomes ``mul_(a, b)`` when ``a`` is a buffer of the step's own that nothing reads afterwards:
made by an op that returns a new tensor (or by an op made in place here on such a buffer, or a
disjoint piece of one, :func:`_exclusive`), read before only by ops that write nothing and
return no view of it, no graph output, and of the result's shape, type and strides.

A parameter or optimizer state the step guard keeps on a skipped step is updated in place
only past the guard's decision (:func:`guarded_updates`): each op of its update chain
(``mul(buffer, 0.9)`` then ``add(that, grad)``; ``addcmul(param, ...)``) becomes
:func:`update_unless`, which on a CPU writes into the state unless the step is skipped (the
guard then picks the state either way, and what the chain fed is read by nothing else) and
elsewhere computes out of place as before. On a GPU the guards first get the finite check read
on the host once (:func:`guards_read_once`), and then do as on a CPU: deciding on the device
instead costs a ``torch.where`` per parameter and state and a copy back (about 3 ms of an
H200's BERT-base step, ``tools/bench/traffic_steps.py``), where one read waits for the device
once, as ``GradScaler.step`` does. Where the unscale writes into the gradients, it
moves into the fused finite check after it (:func:`unscale_in_check`: GradScaler's kernel
unscales as it checks). The values
computed are the same; only where they live changes. ``torch.compile`` gets the functional
graph back (:func:`functional`): inductor plans its own buffers.
"""

from __future__ import annotations

import operator
from collections.abc import Collection
from typing import Any

import torch
from torch import fx

from graphamp.errors import InternalError
from graphamp.fx.dialect import lowering
from graphamp.fx.dialect.lowering import any_non_finite, select_on_host, unscale_and_check
from graphamp.fx.dialect.ops import value_arg

# Elementwise ops whose in-place variant computes the same values into the first operand.
_IN_PLACE = {
    op.overloadpacket: getattr(getattr(torch.ops.aten, f"{op.overloadpacket.__name__}_"), name)
    for op, name in (
        (torch.ops.aten.mul.Tensor, "Tensor"),
        (torch.ops.aten.add.Tensor, "Tensor"),
        (torch.ops.aten.sub.Tensor, "Tensor"),
        (torch.ops.aten.div.Tensor, "Tensor"),
        (torch.ops.aten.addcmul.default, "default"),
        (torch.ops.aten.addcdiv.default, "default"),
        (torch.ops.aten.lerp.Scalar, "Scalar"),
    )
}
IN_PLACE_OPS = frozenset(_IN_PLACE.values())
# Row-wise backward ops whose ``out=`` form, given their first operand (the incoming gradient)
# as ``out``, computes the same values: torch 2.13's CPU kernels read each element of a row
# before writing it (tests/training/test_in_place.py checks it bit for bit); CUDA's
# (``host_softmax_backward``: a block or a warp per row sums the row's gradient, synchronises,
# then each thread writes the elements it alone reads) read a row whole before writing it, and
# tools/gpu/cuda_paths.py checks the values on a GPU against the step without this (the
# CUDA-only passes), so CUDA is an opt-in of :func:`in_place`'s caller. A float32 loss over a
# large vocabulary is where it pays: BERT-base's masked-LM head at batch 32 x 512 holds one
# [16384, 30522] float32 buffer less at the backward's start, 1.86 GiB of an H200 step's 20.5.
_INTO_FIRST = {
    torch.ops.aten._log_softmax_backward_data.default: (
        torch.ops.aten._log_softmax_backward_data.out,
        "out",
    ),
    torch.ops.aten._softmax_backward_data.default: (
        torch.ops.aten._softmax_backward_data.out,
        "grad_input",
    ),
}
_OUT_NAME = {out: name for out, name in _INTO_FIRST.values()}  # out= op: its out name
_INTO_OUT_OPS = frozenset(_OUT_NAME)
_FUNCTIONAL_META = "graphamp_functional"  # on a node made in place: its original target
_COPIED_BACK_META = "graphamp_copied_back"  # and the copy into its first operand it replaced
# Ops whose schema declares a new tensor but which return a view of their input.
_ALIASING_DESPITE_SCHEMA = frozenset(
    {"aten::_unsafe_view", "aten::_reshape_alias", "_c10d_functional::wait_tensor"}
)
# Ops returning their first argument's memory, element for element (no overlap, as expand's):
# through a chain of them read by the next alone, a buffer stays the graph's own.
_SAME_MEMORY = frozenset(
    {
        "aten::view",
        "aten::_unsafe_view",
        "aten::reshape",
        "aten::t",
        "aten::transpose",
        "aten::alias",
        "_c10d_functional::wait_tensor",
        "_c10d_functional::all_reduce_",  # sums into its buffer and returns it
    }
)
_SPLITS = frozenset({"aten::split_with_sizes", "aten::split"})  # disjoint pieces


def in_place(module: fx.GraphModule, into_first_on: Collection[str] = ("cpu",)) -> int:
    """Make ``module``'s eligible elementwise ops in place (see the module docstring), and the
    row-wise backward ops of ``_INTO_FIRST`` on the device types ``into_first_on`` names
    (their values were checked there); the number made."""
    graph = module.graph
    order = {node: index for index, node in enumerate(graph.nodes)}
    owned: set[fx.Node] = {node for node in graph.nodes if _returns_new_tensor(node)}
    made = 0
    for node in graph.nodes:
        target = _in_place_target(node, into_first_on)
        if target is None or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        operand = node.args[0]
        if not _exclusive(operand, owned) or not _same_layout(operand, node):
            continue
        others = [user for user in operand.users if user is not node]
        if any(order[user] > order[node] or not _reads_only(user) for user in others):
            continue
        node.meta[_FUNCTIONAL_META] = node.target
        if target in _INTO_OUT_OPS:  # the out= form, into the operand
            node.kwargs = {**node.kwargs, _OUT_NAME[target]: operand}
        node.target = target
        owned.discard(operand)
        owned.add(node)  # the buffer passes on to this node's value
        made += 1
    return recompiled(module, made)


def written_into_first(node: fx.Node) -> bool:
    """Whether :func:`in_place` made ``node`` a row-wise backward writing into its incoming
    gradient (``_INTO_FIRST``; in an eager graph its target may be the op's Python binding)."""
    traced = node.meta.get(_FUNCTIONAL_META)
    if traced not in _INTO_FIRST:
        return False
    return node.kwargs.get(_OUT_NAME[_INTO_FIRST[traced][0]]) is node.args[0]


def copied_back_in_place(module: fx.GraphModule) -> int:
    """Each ``copy_(state, op(state, ...))`` whose ``op`` has an in-place variant and no other
    reader, with no reader of ``state`` between the two, as ``op_(state, ...)``: one kernel
    where the traced step has two (a batch norm's ``num_batches_tracked += 1``, which
    functionalisation writes as an add and a copy back: 53 of each in ResNet-50's step, where
    eager code launches 53 ``add_``); the number made. :func:`functional` writes the copy
    back again."""
    graph = module.graph
    order = {node: index for index, node in enumerate(graph.nodes)}
    made = 0
    for copy in list(graph.nodes):
        if copy.target is not torch.ops.aten.copy_.default or len(copy.args) != 2:
            continue
        state, update = copy.args
        # (no device named: a row-wise backward's out= form is not an in-place op here)
        target = _in_place_target(update) if isinstance(update, fx.Node) else None
        if target is None or update.args[0] is not state:
            continue
        if list(update.users) != [copy] or not _same_layout(state, update):
            continue
        between = [
            user
            for user in state.users
            if user not in (update, copy) and order[update] < order[user] < order[copy]
        ]
        if between:  # a reader there sees the old value, which an update in place overwrote
            continue
        update.meta[_FUNCTIONAL_META] = update.target
        update.meta[_COPIED_BACK_META] = True
        update.target = target
        copy.replace_all_uses_with(update)  # both return the state's memory
        graph.erase_node(copy)
        made += 1
    return recompiled(module, made)


def update_unless(
    found_inf: torch.Tensor | bool,
    in_place_op: Any,
    op: Any,
    target: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """``op(target, *args)``, written into ``target`` on a CPU (``target`` left as it is
    when ``found_inf``: the step guard keeps it); out of place elsewhere, where reading
    ``found_inf`` on the host would wait for the device."""
    if not lowering.reads_on_host(found_inf):
        return op(target, *args, **kwargs)
    if bool(found_inf):
        return target
    return in_place_op(target, *args, **kwargs)


def guarded_updates(module: fx.GraphModule) -> int:
    """Make each op of the update chain of a kept parameter or state an :func:`update_unless`
    (see the module docstring); how many chains.

    A chain runs from the kept tensor to its new value, each op elementwise with an in-place
    form, of the kept tensor's layout, reading the previous one as its first operand, which
    nothing else reads. Its values (and everything computed from them) must reach no output but
    the guard's choice of the new value: a skipped step reads the kept tensor in their place.
    Every other reader of the kept tensor runs before the chain's first op and returns a new
    tensor (no view of it outlives the write). The chain runs where it is when the finite check
    comes before it; a one-op chain the guard alone reads moves past the check, right before
    the guard, where it then must not read another moved update's kept tensor."""
    graph = module.graph
    order = {node: index for index, node in enumerate(graph.nodes)}
    made = 0
    for guard in [n for n in graph.nodes if n.target is select_on_host]:
        found_inf, *old_and_new = guard.args
        discarded = _discarded_when_skipped(graph, guard)
        chains = [
            (old, chain)
            for old, new in zip(old_and_new[0::2], old_and_new[1::2], strict=True)
            if old.op == "placeholder"
            and (chain := _update_chain(old, new)) is not None
            and all(link in discarded for link in chain)
        ]
        moving = {
            chain[0]
            for _, chain in chains
            if order[chain[0]] < order[found_inf] and set(chain[0].users) == {guard}
        }
        for old, chain in chains:
            first = chain[0]
            moved = first in moving
            if order[first] < order[found_inf] and not moved:
                continue
            runs_at = order[guard] if moved else order[first]
            readers = [user for user in old.users if user is not first and user is not guard]
            if any(
                order[user] > runs_at or (moved and user in moving) or not _reads_only(user)
                for user in readers
            ):
                continue
            if moved:
                guard.prepend(first)  # past the finite check: update_unless reads found_inf
            for link in chain:
                op = link.target
                if not isinstance(op, torch._ops.OpOverload):  # (a chain holds aten ops only)
                    raise InternalError(f"update chain op {link.name!r} calls {op!r}")
                link.args = (found_inf, _in_place_target(link), op, *link.args)
                link.target = update_unless
            made += 1
    return recompiled(module, made)


def _update_chain(old: fx.Node, new: fx.Node) -> list[fx.Node] | None:
    """The ops from ``old`` to ``new``, first to last, when each has an in-place form, the
    layout of ``old``, and reads the previous one (``old`` for the first) as its first
    operand, which nothing else reads; None otherwise."""
    chain: list[fx.Node] = []
    link = new
    while True:
        target = _in_place_target(link)
        if target not in IN_PLACE_OPS or not link.args or not _same_layout(old, link):
            return None
        chain.append(link)
        head = link.args[0]
        if head is old:
            return chain[::-1]
        if not isinstance(head, fx.Node) or set(head.users) != {link}:
            return None
        link = head


def _discarded_when_skipped(graph: fx.Graph, guard: fx.Node) -> set[fx.Node]:
    """The nodes whose values reach no output but the ``guard``'s choice of a new value: on a
    skipped step the guard picks the kept values instead, and these are read by nothing."""
    found_inf, *old_and_new = guard.args
    kept = {found_inf, *old_and_new[0::2]}
    discarded: set[fx.Node] = set()
    for node in reversed(graph.nodes):
        if (
            node.users
            and node not in kept
            and all(user in discarded or user is guard for user in node.users)
        ):
            discarded.add(node)
    return discarded


def guards_read_once(module: fx.GraphModule) -> int:
    """Give the step guards of ``module`` (:func:`select_on_host`, :func:`update_unless`; run
    before :mod:`~graphamp.fx.training.foreach` groups the latter, which keeps what they
    read) the finite check's result read on the host once
    (:func:`~graphamp.fx.dialect.lowering.read_on_host`), right where the check makes it, in
    place of the tensor: then they update in place and choose on the host. For a step on a
    GPU (on a CPU the guards read the tensor there already); the other readers of the check
    (the loss scale's update, the skip count) keep the tensor. Returns how many guards."""
    graph = module.graph
    read: dict[fx.Node, fx.Node] = {}
    made = 0
    for guard in list(graph.nodes):
        if guard.op != "call_function" or guard.target not in (select_on_host, update_unless):
            continue
        flag = guard.args[0]
        if not isinstance(flag, fx.Node) or flag.target is lowering.read_on_host:
            continue
        if flag not in read:
            with graph.inserting_after(flag):
                read[flag] = graph.call_function(lowering.read_on_host, (flag,))
            read[flag].meta["val"] = False
        guard.update_arg(0, read[flag])
        made += 1
    return recompiled(module, made)


def guards_read_on_device(module: fx.GraphModule) -> fx.GraphModule:
    """:func:`guards_read_once` undone: for ``torch.compile``, whose guards are traced
    ``torch.where`` ops over the tensor."""
    graph = module.graph
    made = 0
    for node in [n for n in graph.nodes if n.target is lowering.read_on_host]:
        node.replace_all_uses_with(node.args[0])
        graph.erase_node(node)
        made += 1
    recompiled(module, made)
    return module


def unscale_in_check(module: fx.GraphModule) -> int:
    """Fold an unscale that :func:`in_place` made write into the gradients into the fused
    finite check after it: :func:`unscale_and_check` multiplies by the inverse scale as it
    checks (GradScaler's kernel, one pass), and the gradients' later readers read them
    unscaled. Only where every gradient of the check is such a ``mul_`` by one inverse scale
    and nothing reads an unscaled gradient before the check. Returns how many checks."""
    graph = module.graph
    order = {node: index for index, node in enumerate(graph.nodes)}
    made = 0
    for check in [n for n in graph.nodes if n.target is any_non_finite]:
        unscales = [a for a in check.args if isinstance(a, fx.Node)]
        inverse = unscales[0].args[1] if unscales and len(unscales[0].args) == 2 else None
        if not (
            isinstance(inverse, fx.Node)
            and len(unscales) == len(check.args)
            and all(u.target is torch.ops.aten.mul_.Tensor for u in unscales)
            and all(u.args[1] is inverse and not u.kwargs for u in unscales)
            and len({u.args[0] for u in unscales}) == len(unscales)  # none unscaled twice
            and all(order[user] > order[check] for u in unscales for user in set(u.users) - {check})
        ):
            continue
        gradients = [value_arg(u) for u in unscales]
        check.target, check.args = unscale_and_check, (inverse, *gradients)
        for unscale, gradient in zip(unscales, gradients, strict=True):
            unscale.replace_all_uses_with(gradient)
            graph.erase_node(unscale)
        made += 1
    return recompiled(module, made)


def _split_unscale(graph: fx.Graph, check: fx.Node) -> None:
    """Undo :func:`unscale_in_check` for ``check``: the functional multiplications before it,
    and the readers after it reading them."""
    inverse = check.args[0]
    order = {node: index for index, node in enumerate(graph.nodes)}
    unscaled = []
    for position in range(1, len(check.args)):
        gradient = value_arg(check, position)
        with graph.inserting_before(check):
            multiply = graph.call_function(torch.ops.aten.mul.Tensor, (gradient, inverse))
        multiply.meta["val"] = gradient.meta.get("val")
        for user in [u for u in gradient.users if order.get(u, -1) > order[check]]:
            user.replace_input_with(gradient, multiply)
        unscaled.append(multiply)
    check.target, check.args = any_non_finite, tuple(unscaled)


def functional(module: fx.GraphModule) -> fx.GraphModule:
    """``module`` with the ops :func:`in_place`, :func:`guarded_updates` and
    :func:`unscale_in_check` changed back to their functional forms."""
    changed = False
    for node in list(module.graph.nodes):
        if node.target is unscale_and_check:
            _split_unscale(module.graph, node)
            changed = True
            continue
        if node.target is update_unless:  # from its arguments: they follow replacements
            node.target, node.args = node.args[2], tuple(node.args[3:])
            changed = True
            continue
        original = node.meta.pop(_FUNCTIONAL_META, None)
        if original is not None:
            if node.target in _INTO_OUT_OPS:
                node.kwargs = {k: v for k, v in node.kwargs.items() if k != _OUT_NAME[node.target]}
            node.target = original
            if node.meta.pop(_COPIED_BACK_META, False):
                _copy_back(module.graph, node)
            changed = True
    if changed:
        module.recompile()
    return module


def _copy_back(graph: fx.Graph, update: fx.Node) -> None:
    """The copy of ``update`` into its first operand that :func:`copied_back_in_place`
    replaced, written again after it; its readers read the copy (the state), as before."""
    state = value_arg(update)
    with graph.inserting_after(update):
        copy = graph.call_function(torch.ops.aten.copy_.default, (state, update))
    copy.meta["val"] = state.meta.get("val")
    update.replace_all_uses_with(copy, delete_user_cb=lambda user: user is not copy)


def recompiled(module: fx.GraphModule, made: int) -> int:
    """``made``, after checking and recompiling ``module`` when a pass changed it."""
    if made:
        module.graph.lint()
        module.recompile()
    return made


def _aten_op(node: fx.Node) -> torch._ops.OpOverload | None:
    """The op ``node`` calls, when it is an operator with a schema."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    return node.target


def _in_place_target(
    node: fx.Node, into_first_on: Collection[str] = ()
) -> torch._ops.OpOverload | None:
    """The op ``node`` becomes in place, if any: an elementwise op's in-place variant, or a
    row-wise backward's ``out=`` form where its value lives on a device ``into_first_on``
    names."""
    op = _aten_op(node)
    if op is None:
        return None
    if op in _INTO_FIRST:
        value = node.meta.get("val")
        where = value.device.type if isinstance(value, torch.Tensor) else None
        return _INTO_FIRST[op][0] if where in into_first_on else None
    variant = _IN_PLACE.get(op.overloadpacket)
    if variant is None or op._overloadname != variant._overloadname:
        return None
    return variant


def _exclusive(node: fx.Node, owned: set[fx.Node]) -> bool:
    """Whether ``node``'s value is memory nothing else in the graph sees: an owned buffer, or
    the same memory (or one of the disjoint pieces a split makes of it) reached through a
    chain of ops each read by the next alone: a bucket all-reduced in place, then split into
    the gradients it carries."""
    while node not in owned:
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:
            split, index = node.args
            if (
                not isinstance(split, fx.Node)
                or _schema_name(split) not in _SPLITS
                or any(user.target is not operator.getitem for user in split.users)
                or [user.args[1] for user in split.users].count(index) != 1
            ):
                return False
            node = split
        elif _schema_name(node) not in _SAME_MEMORY:
            return False
        base = node.args[0]
        if not isinstance(base, fx.Node) or len(base.users) != 1:
            return False
        node = base
    return True


def _schema_name(node: fx.Node) -> str:
    op = _aten_op(node)
    return op._schema.name if op is not None else ""


def _reads_only(node: fx.Node) -> bool:
    """Whether ``node`` is an aten op that writes none of its inputs and returns no alias of
    one (a reader after which writing into its input changes nothing it gave), or the fused
    finite check (it writes back each value it reads, unchanged, and returns a new flag)."""
    if node.op == "call_function" and node.target is any_non_finite:
        return True
    op = _aten_op(node)
    if op is None:
        return False
    schema = op._schema
    return (
        schema.name not in _ALIASING_DESPITE_SCHEMA
        and not schema.is_mutable
        and all(returned.alias_info is None for returned in schema.returns)
    )


def _returns_new_tensor(node: fx.Node) -> bool:
    """Whether ``node`` is such an op returning one tensor, or the one reader of one of the
    tensors such an op returns several of (a layer norm's backward: its three gradients): a
    buffer no one else sees."""
    if node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        source, index = node.args[0], node.args[1]
        return (
            _new_tensors(source) > 1
            and all(user.target is operator.getitem for user in source.users)
            and [user.args[1] for user in source.users].count(index) == 1
        )
    return _new_tensors(node) == 1


def _new_tensors(node: fx.Node) -> int:
    """How many new tensors ``node`` returns: an op that writes none of its inputs and
    returns only tensors, none of them an alias; 0 for any other node."""
    op = _aten_op(node)
    if op is None or not _reads_only(node):
        return 0
    returns = op._schema.returns
    return len(returns) if all(isinstance(r.type, torch.TensorType) for r in returns) else 0


def _same_layout(operand: fx.Node, node: fx.Node) -> bool:
    """The result has the operand's shape, type and strides (no broadcast into it, no type
    promotion out of it)."""
    have, want = operand.meta.get("val"), node.meta.get("val")
    if not isinstance(have, torch.Tensor) or not isinstance(want, torch.Tensor):
        return False
    return (
        have.shape == want.shape
        and have.dtype == want.dtype
        and have.stride() == want.stride()
        and have.device == want.device
    )
