"""Runs of one in-place update over many tensors in an eager step graph, called as one
foreach op.

After :mod:`graphamp.fx.training.in_place`, an optimizer's tail is runs of the same update on every
parameter: ``add_(grad, momentum, alpha=0.9)`` once per parameter, then
:func:`~graphamp.fx.training.in_place.update_unless` of ``addcmul_`` once per parameter (the
formulas are written one operation at a time over all tensors,
:func:`graphamp.fx.training.optim.update`). Run node by node, each is a Python call and a dispatch
(and on a GPU a kernel launch), where torch.optim calls one ``_foreach_*_`` op per list.
:func:`grouped` turns each run of consecutive, independent nodes with the same op and the same
non-tensor arguments into one call of the matching foreach op (``_foreach_add_.List``,
``_foreach_addcmul_.Scalar``...), which on a CPU runs the same kernel per tensor (on a GPU,
torch.optim's multi-tensor kernels: what its foreach path computes). The few functional ops
an optimizer's formulas make new tensors with (Adam's ``sqrt`` of each second moment and
``mul`` of its step size by each first moment) are grouped alike, into the functional foreach
op: per parameter they were two Python calls and two kernel launches more per step.
``torch.compile`` gets the nodes back one by one (:func:`ungrouped`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from graphamp.errors import InternalError
from graphamp.fx.dialect import lowering
from graphamp.fx.dialect.ops import tensor_value, value_arg
from graphamp.fx.training.in_place import IN_PLACE_OPS, recompiled, update_unless

_MEMBERS_META = "graphamp_foreach_members"  # on a grouped node: its members, to undo
_SHORTEST_RUN = 2
# Ops whose foreach kernel, on bfloat16/float16 tensors and a number, rounds the number to the
# tensors' type before multiplying (torch 2.13's CPU ``_foreach_mul_.Scalar``), where the
# per-tensor kernel multiplies by it in float32: grouped, a momentum ``mul_(0.9)`` would
# compute other bits than torch.optim's. Such runs stay per tensor.
_ROUNDS_ITS_NUMBER = frozenset({"mul"})
_REDUCED = frozenset({torch.bfloat16, torch.float16})
# Functional ops grouped too: an optimizer's formulas compute some values into new tensors
# (Adam's square root of its second moment, its step size times its first moment, once per
# parameter), where the moments are read again. ``mul`` is commutative: a run that shares its
# first operand is called with the list first, as the foreach op takes it.
_FUNCTIONAL = frozenset({torch.ops.aten.sqrt.default, torch.ops.aten.mul.Tensor})
_COMMUTATIVE = frozenset({torch.ops.aten.mul.Tensor})


def each_in_place(op: Any, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
    """``op`` (an in-place foreach op) on the lists in ``args``; the tensors it wrote."""
    op(*args, **kwargs)
    return args[0]


def each_result(op: Any, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
    """``op`` (a functional foreach op) on the lists in ``args``; the tensors it made."""
    return list(op(*args, **kwargs))


def updates_unless(
    found_inf: torch.Tensor | bool,
    in_place_op: Any,
    op: Any,
    targets: list[torch.Tensor],
    *args: Any,
    **kwargs: Any,
) -> list[torch.Tensor]:
    """:func:`~graphamp.fx.training.in_place.update_unless` over lists: the in-place foreach op into
    ``targets`` on a CPU (``targets`` as they are when ``found_inf``), the functional one
    elsewhere, where reading ``found_inf`` on the host would wait for the device."""
    if not lowering.reads_on_host(found_inf):
        return list(op(targets, *args, **kwargs))
    if not bool(found_inf):
        in_place_op(targets, *args, **kwargs)
    return targets


def grouped(module: fx.GraphModule) -> int:
    """Call each run of consecutive, independent in-place updates (or ``sqrt``/``mul`` into
    new tensors) with the same op and the same non-tensor arguments as one foreach op (see
    the module docstring); how many runs."""
    made = sum(_group(module.graph, run) for run in _runs(module.graph))
    return recompiled(module, made)


def ungrouped(module: fx.GraphModule) -> fx.GraphModule:
    """``module`` with every grouped node made its members again, one node each."""
    graph = module.graph
    changed = False
    for node in list(graph.nodes):
        members = node.meta.get(_MEMBERS_META)
        if members is None:
            continue
        pieces = {user.args[1]: user for user in node.users}
        for index, meta in enumerate(members.metas):
            with graph.inserting_before(node):
                member = graph.call_function(members.target, members.args(node, index), node.kwargs)
            member.meta.update(meta)
            if index in pieces:
                pieces[index].replace_all_uses_with(member)
                graph.erase_node(pieces[index])
        graph.erase_node(node)
        changed = True
    if changed:
        graph.lint()
        module.recompile()
    return module


@dataclass(frozen=True)
class _Members:
    """What :func:`ungrouped` needs to make a grouped node's members again: their op (and
    for :func:`~graphamp.fx.training.in_place.update_unless`, the per-tensor ops it calls) and their
    meta. Their tensors are read from the grouped node's arguments at that time, so that a
    node replaced since (another group's undone) is the one they read."""

    target: Any
    per_tensor_ops: tuple[Any, ...]  # update_unless's in-place and functional ops, or ()
    metas: list[dict[str, Any]]

    def args(self, grouped_node: fx.Node, index: int) -> tuple[Any, ...]:
        """Member ``index``'s arguments."""
        skip = 3 if self.per_tensor_ops else 1  # (found_inf and the foreach ops) or the op
        own = [a[index] if isinstance(a, list) else a for a in grouped_node.args[skip:]]
        head = (grouped_node.args[0], *self.per_tensor_ops) if self.per_tensor_ops else ()
        return (*head, *own)


def _key(node: fx.Node) -> tuple | None:
    """What a node must share with its neighbours to join their run: its op, and each
    argument that is not a tensor of its own (``None``: it joins no run)."""
    if node.op != "call_function":
        return None
    if node.target is update_unless:
        found_inf, in_place_op, op, *rest = node.args
        head: tuple = (update_unless, found_inf, in_place_op, op)
    elif node.target in IN_PLACE_OPS or node.target in _FUNCTIONAL:
        head, rest = (node.target,), list(node.args)
    else:
        return None
    shape = tuple("tensor" if isinstance(a, fx.Node) else ("value", a) for a in rest[1:])
    return (*head, shape, tuple(sorted(node.kwargs.items())))


def _runs(graph: fx.Graph) -> list[list[fx.Node]]:
    """Maximal runs of consecutive nodes with one key and independent of each other: none
    reads what another writes or returns (a GPU's foreach kernel runs them at once)."""
    runs: list[list[fx.Node]] = []
    run: list[fx.Node] = []
    key: tuple | None = None
    written: set[fx.Node] = set()
    read: set[fx.Node] = set()
    for node in graph.nodes:
        node_key = _key(node)
        inputs = set(node.all_input_nodes)
        target = _written(node) if node_key is not None else None
        joins = (
            node_key is not None
            and node_key == key
            and not inputs & written
            and target not in written
            and target not in read
        )
        if not joins:
            if len(run) >= _SHORTEST_RUN:
                runs.append(run)
            run, key, written, read = [], node_key, set(), set()
        if node_key is not None and target is not None:  # (both or neither)
            run.append(node)
            written |= {node, target}
            read |= inputs - {target}
    if len(run) >= _SHORTEST_RUN:
        runs.append(run)
    return runs


def _written(node: fx.Node) -> fx.Node:
    """The tensor ``node`` writes into (a functional op: its own, new)."""
    if node.target in _FUNCTIONAL:
        return node
    return value_arg(node, 3 if node.target is update_unless else 0)


def _swapped_alike(node: fx.Node, offset: int) -> bool:
    """Whether ``node`` (a commutative op) called with its first two operands swapped makes
    its value in the same layout: the product is the same number, but an elementwise op lays
    its result out after its first operand where the operands' layouts differ (a permuted
    gradient times a contiguous value), and a reduction after it then sums in another order
    (ConvNeXt's layer scale: its gradient a few units in the last place off)."""
    first, second = (tensor_value(a) for a in node.args[offset : offset + 2])
    have = node.meta.get("val")
    if not isinstance(have, torch.Tensor) or first is None or second is None:
        return False

    def meta(value: torch.Tensor) -> torch.Tensor:
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")

    return meta(second).mul(meta(first)).stride() == have.stride()


def _group(graph: fx.Graph, run: list[fx.Node]) -> bool:
    """Replace ``run`` by one call of its foreach op, when there is one that takes its
    arguments; whether it did."""
    first = run[0]
    guarded = first.target is update_unless
    offset = 3 if guarded else 0
    columns = list(zip(*(node.args[offset:] for node in run), strict=True))
    arguments: list[Any] = []
    kinds: list[str] = []
    for column in columns:
        if not isinstance(column[0], fx.Node):
            arguments.append(column[0])
            kinds.append("scalar")
        elif len(set(column)) == 1:
            arguments.append(column[0])
            kinds.append("shared" if _zero_dim(column[0]) else "shared list")
        else:
            arguments.append(list(column))
            kinds.append("list")
    functional = first.target in _FUNCTIONAL
    if first.target in _COMMUTATIVE and kinds[0] != "list" and kinds[1:2] == ["list"]:
        if not all(_swapped_alike(node, offset) for node in run):
            return False
        arguments[:2], kinds[:2] = arguments[1::-1], kinds[1::-1]
    per_tensor = first.args[1] if guarded else first.target
    if not isinstance(per_tensor, torch._ops.OpOverload):  # (a run holds aten ops only)
        raise InternalError(f"update {first.name!r} calls {per_tensor!r}")
    value = first.meta.get("val")
    if (
        "scalar" in kinds
        and per_tensor.overloadpacket.__name__.rstrip("_") in _ROUNDS_ITS_NUMBER
        and getattr(value, "dtype", None) in _REDUCED
    ):
        return False
    in_place_op = _foreach(per_tensor, kinds, first.kwargs, in_place=not functional)
    if in_place_op is None or (functional and kinds[0] != "list"):
        return False
    chosen = [_takes_one(in_place_op, i) for i in range(len(kinds))]
    arguments = [
        [a] * len(run) if kind.startswith("shared") and not one else a
        for a, kind, one in zip(arguments, kinds, chosen, strict=True)
    ]
    if guarded:
        functional_op = getattr(_packet(per_tensor, in_place=False), in_place_op._overloadname)
        target: Any = updates_unless
        arguments = [first.args[0], in_place_op, functional_op, *arguments]
    else:
        target = each_result if functional else each_in_place
        arguments = [in_place_op, *arguments]
    with graph.inserting_after(run[-1]):
        call = graph.call_function(target, tuple(arguments), dict(first.kwargs))
    per_tensor_ops = tuple(first.args[1:3]) if guarded else ()
    call.meta[_MEMBERS_META] = _Members(first.target, per_tensor_ops, [dict(n.meta) for n in run])
    last = call
    for index, node in enumerate(run):
        with graph.inserting_after(last):
            piece = graph.call_function(operator.getitem, (call, index))
        piece.meta["val"] = node.meta.get("val")
        node.replace_all_uses_with(piece)
        last = piece
    for node in reversed(run):
        graph.erase_node(node)
    return True


def _packet(per_tensor: torch._ops.OpOverload, *, in_place: bool) -> Any:
    """The foreach op packet of an in-place per-tensor op (``add_`` -> ``_foreach_add_``, or
    ``_foreach_add`` for its functional form); None where there is none."""
    name = per_tensor.overloadpacket.__name__.rstrip("_")
    return getattr(torch.ops.aten, f"_foreach_{name}{'_' if in_place else ''}", None)


def _foreach(
    per_tensor: torch._ops.OpOverload, kinds: list[str], kwargs: dict[str, Any], *, in_place: bool
) -> torch._ops.OpOverload | None:
    """The foreach overload that takes a run's arguments: a list where each member has its
    own tensor, a scalar where they share one, one tensor or a list where they share a 0-dim
    tensor (one tensor preferred: a GPU's foreach kernel takes a shared scalar tensor on its
    fast path), a list where they share a tensor of another shape, and the members' keyword
    arguments as scalars."""
    packet = _packet(per_tensor, in_place=in_place)
    best, best_score = None, -1
    for name in packet.overloads() if packet is not None else ():
        if name.endswith("out"):
            continue
        op = getattr(packet, name)
        arguments = op._schema.arguments
        positional = [a for a in arguments if not a.kwarg_only]
        rest = {a.name: a for a in arguments[len(kinds) :]}
        if (
            len(kinds) > len(positional)
            or not all(_accepts(str(a.type), k) for a, k in zip(positional, kinds, strict=False))
            or any(k not in rest or str(rest[k].type) != "number" for k in kwargs)
            or any(not a.has_default_value() and a.name not in kwargs for a in rest.values())
        ):
            continue
        score = sum(str(a.type) == "Tensor" for a in positional[: len(kinds)])
        if score > best_score:
            best, best_score = op, score
    return best


def _accepts(type_name: str, kind: str) -> bool:
    if kind in ("list", "shared list"):
        return type_name == "List[Tensor]"
    if kind == "shared":
        return type_name in ("Tensor", "List[Tensor]")
    return type_name == "number"


def _zero_dim(node: fx.Node) -> bool:
    """Whether ``node``'s value is a 0-dim tensor: the one tensor a foreach op's ``Tensor``
    overload takes (``_foreach_mul.Tensor``: "scalar tensor expected to be 0 dim"); a shared
    tensor of any other shape is passed as a list repeating it."""
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.dim() == 0


def _takes_one(op: torch._ops.OpOverload, position: int) -> bool:
    """Whether ``op`` takes one tensor (not a list) at ``position``."""
    return str(op._schema.arguments[position].type) == "Tensor"
