"""Forward values an eager step computes again in its backward instead of holding them.

A traced step's backward reads forward values (what autograd saves); run op by op, each is
held from where the forward makes it until the backward's last read, across the whole peak of
the step. Some are one elementwise op, or a view, away from values the backward reads anyway:
a dropout's product (the probabilities times the mask, read again by the attention's second
matrix product), both of whose operands the backward reads too. :func:`saved_less` computes
such a value again right before the backward first reads it, from those operands, so the
forward's copy is freed after its last forward reader: BERT-base's attention at batch 32
(sequence 128) held 288 MiB of float32 products through the step's peak (BENCHMARKS.md,
History, issue 42). The ops are deterministic and read the same operands, so the values are
the same; the price is one elementwise pass per value, which AOTAutograd's partitioner pays
for the same values (it recomputes cheap ops rather than saving them). A value computed from
the step's arguments alone (a weight's cast to the low type) stays held unless ``casts``
(``train_step``'s ``recompute_casts``, by default in a CPU's eager step, where it cost no
consistent time) asks to compute them again too, and each held value
cheap ops make from a forward value of fewer bytes that the backward does not read (HF
BERT's attention on a CPU widens its bfloat16 query, key and value to float32 and holds the
float32 copies): that smaller value is held instead; together BERT-base's eager step at
batch 8 peaks 264 MiB lower, 0.73x float32's (BENCHMARKS.md, issue 42). A compiled step
keeps the copies (but those made for ``casts`` without ``compiled_too``, which
:func:`held_again` undoes): inductor, given the step as one graph, holds what the graph
holds (it recomputes only in a graph it differentiates itself), and fuses each copy into
the backward kernel that reads it.
"""

from __future__ import annotations

import torch
from torch import fx

from graphamp.fx.training.in_place import recompiled
from graphamp.fx.training.partition import forward_nodes

_RECOMPUTED_META = "graphamp_recomputed"  # on a copy made in the backward: the forward node's name
# (read by no pass but held_again: it says where a node of the graph comes from)
_CAST_META = "graphamp_recomputed_cast"  # on a copy made only for ``casts``, which held_again
# undoes for torch.compile

aten = torch.ops.aten
# Ops cheap to run again: elementwise arithmetic, casts and copies, and views.
_CHEAP = frozenset(
    {
        aten.mul.Tensor,
        aten.mul.Scalar,
        aten.div.Tensor,
        aten.div.Scalar,
        aten.add.Tensor,
        aten.sub.Tensor,
        aten.neg.default,
        aten._to_copy.default,
        aten.clone.default,
        aten.view.default,
        aten._unsafe_view.default,
        aten.expand.default,
        aten.t.default,
        aten.transpose.int,
        aten.permute.default,
        aten.unsqueeze.default,
        aten.squeeze.dim,
    }
)


def saved_less(module: fx.GraphModule, casts: bool = False, compiled_too: bool = True) -> int:
    """Compute again in the backward each forward value it reads that :data:`_CHEAP` ops make
    from values the backward reads anyway (see the module docstring); how many values. With
    ``casts``, also the weights' casts (values of the step's arguments alone) and each value
    cheap ops make from forward values smaller than it, which are then held in its place
    (a float32 copy of a bfloat16 activation: the bfloat16 one is held); without
    ``compiled_too``, :func:`held_again` undoes those for ``torch.compile``."""
    graph = module.graph
    forward = forward_nodes(module)
    if forward is None:
        return 0
    order = {node: index for index, node in enumerate(graph.nodes)}
    loss = max(forward, key=order.__getitem__)

    def backward_readers(node: fx.Node) -> list[fx.Node]:
        """``node``'s readers after the loss (a node the loss does not need that runs before
        it, a cast nothing reads, is the forward's)."""
        return [u for u in node.users if order[u] > order[loss] and u.op != "output"]

    held = {node for node in forward if backward_readers(node)}
    cheap: set[fx.Node] = set()
    for_casts: set[fx.Node] = set()  # cheap only because of ``casts``
    arguments = {n for n in graph.nodes if n.op in ("placeholder", "get_attr")}
    for node in graph.nodes:  # in order: a node's inputs are judged before it
        if node in forward and node.target in _CHEAP and not node.kwargs.get("out"):
            inputs = node.all_input_nodes
            # a value of the arguments alone (a weight's cast) is held, as autograd holds it,
            # unless ``casts``: casting BERT-base's 110 M weights again cost 1.5% of its step
            # for 210 MiB in one measurement, nothing consistent in later ones
            of_arguments = set(inputs) <= arguments
            if of_arguments and not casts:
                continue
            if all(i in cheap or i in held or i in arguments for i in inputs):
                cheap.add(node)
                if of_arguments or for_casts.intersection(inputs):
                    for_casts.add(node)

    def first_reader(node: fx.Node) -> fx.Node:
        return min(backward_readers(node), key=order.__getitem__)

    def held_inputs(node: fx.Node) -> set[fx.Node]:
        """The values held anyway that ``node`` is computed from, through cheap ops."""
        found: set[fx.Node] = set()
        for value in node.all_input_nodes:
            if value in held:
                found.add(value)
            elif value in cheap:
                found |= held_inputs(value)
        return found

    # a value is computed again only where every value it is made from is still held (read
    # there or later), so that no value is held longer than before
    recomputed = {
        node
        for node in held & cheap
        if not _view_of_held(node, held)
        and all(
            max(order[u] for u in backward_readers(value)) >= order[first_reader(node)]
            for value in held_inputs(node)
        )
    }
    if casts:
        smaller = _from_smaller(forward, held, cheap, recomputed, arguments)
        recomputed |= smaller
        for_casts |= smaller
    copies: dict[fx.Node, fx.Node] = {}
    undone = False  # whether the copies being made are held_again's to undo

    def copy(node: fx.Node, before: fx.Node) -> fx.Node:
        if node not in cheap or (node in held and node not in recomputed):
            return node  # held anyway (or an argument): read as it is
        if node not in copies:
            args = [copy(i, before) for i in node.all_input_nodes]
            mapping = dict(zip(node.all_input_nodes, args, strict=True))
            with graph.inserting_before(before):
                made = graph.node_copy(node, mapping.__getitem__)
            made.meta = {"val": node.meta.get("val"), _RECOMPUTED_META: node.name}
            if undone:
                made.meta[_CAST_META] = True
            copies[node] = made
        return copies[node]

    for node in sorted(recomputed, key=lambda node: order[first_reader(node)]):
        undone = node in for_casts and not compiled_too
        made = copy(node, first_reader(node))
        for reader in backward_readers(node):
            reader.replace_input_with(node, made)
    return recompiled(module, len(recomputed))


def held_again(module: fx.GraphModule) -> int:
    """``module`` with each copy :func:`saved_less` made for ``casts`` without
    ``compiled_too`` read as the forward value it copies again (held from the forward, as
    traced); how many copies. After the passes that write in place are undone: the forward
    value is then the one the copy computed again."""
    graph = module.graph
    by_name = {node.name: node for node in graph.nodes}
    copies = [node for node in graph.nodes if node.meta.get(_CAST_META)]
    for node in reversed(copies):  # readers first: each copy is read by no other copy left
        node.replace_all_uses_with(by_name[node.meta[_RECOMPUTED_META]])
        graph.erase_node(node)
    return recompiled(module, len(copies))


def _from_smaller(
    forward: set[fx.Node],
    held: set[fx.Node],
    cheap: set[fx.Node],
    recomputed: set[fx.Node],
    arguments: set[fx.Node],
) -> set[fx.Node]:
    """The held values :data:`_CHEAP` ops make from forward values (their sources) that hold
    fewer bytes than they do and that the backward does not read: each source joins ``held``
    and the ops between join ``cheap``, so the value is computed again from it."""
    chosen: set[fx.Node] = set()
    for value in sorted(held - recomputed, key=lambda node: node.name):
        if value.target not in _CHEAP or _view_of_held(value, held):
            continue
        chain, sources = _cheap_chain(value, forward, held, arguments)
        if chain is None or not sources:
            continue
        new = [source for source in sources if source not in held]
        if sum(map(_bytes, new)) >= _bytes(value):
            continue
        held.update(new)
        cheap.update(chain)
        chosen.add(value)
    return chosen


def _cheap_chain(
    value: fx.Node, forward: set[fx.Node], held: set[fx.Node], arguments: set[fx.Node]
) -> tuple[set[fx.Node] | None, set[fx.Node]]:
    """The :data:`_CHEAP` ops ``value`` is made by from held values, arguments and other
    forward values (its sources, returned second); None first where a forward op on the way
    writes an argument (an ``out=``)."""
    chain: set[fx.Node] = set()
    sources: set[fx.Node] = set()
    stack = [value]
    while stack:
        node = stack.pop()
        if node.kwargs.get("out"):
            return None, sources
        chain.add(node)
        for parent in node.all_input_nodes:
            if parent in arguments or (parent in held and parent is not value):
                continue
            if parent in forward and parent.target in _CHEAP:
                stack.append(parent)
            elif parent in forward:
                sources.add(parent)
            else:
                return None, sources
    return chain, sources


def _bytes(node: fx.Node) -> int:
    """The bytes holding ``node``'s value holds: its storage's (a view holds its base)."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return 1 << 62  # not a tensor of known size: never held in a value's place
    return value.untyped_storage().nbytes()


def _view_of_held(node: fx.Node, held: set[fx.Node]) -> bool:
    """Whether ``node`` is a view of a value held anyway: its memory is held either way."""
    while isinstance(node.target, torch._ops.OpOverload) and node.target.is_view:
        base = node.args[0]
        if not isinstance(base, fx.Node):
            return False
        if base in held or base.op in ("placeholder", "get_attr"):
            return True
        node = base
    return False
