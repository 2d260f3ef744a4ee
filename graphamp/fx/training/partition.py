"""A step graph cut in two for ``torch.compile``: the forward (the loss and what it is computed
from) and the rest (backward, finite check, optimizer update).

A traced step is one graph holding forward, backward and update. Handed to ``torch.compile``
whole, inductor schedules and fuses all of it together: it puts forward ops (a batch norm's
normalisation, a ReLU, a weight's cast) into the backward kernels that read them, and plans
one set of buffers across both. ``torch.compile``'s own training path never gives inductor
such a graph: AOTAutograd's partitioner splits forward from backward, and inductor compiles
each. :func:`split` makes the same cut in graphamp's step: the forward graph is the loss's
ancestors and returns the loss and every value of them the rest reads (AOTAutograd's saved
activations); the rest graph takes the step's arguments it reads and those values, and returns
the step's other outputs. Running the forward, then the rest, computes the same ops on the same
inputs in the same order of writes as the whole graph (see :func:`split` for what keeps that
true), so the values are the whole graph's. The cut is not free: it saves every value the
rest reads, where AOTAutograd recomputes cheap ones, and holds them until the rest returns; a
step is cut where that pays (:func:`cut_pays`: a forward with batch norms).

The forward's values reach the rest in the layout inductor chose for them, as AOTAutograd's
saved activations do (:func:`forward_options`): by default inductor gives a graph's outputs
the strides of the traced graph, so each convolution output and activation the backward reads
would be copied from channels-last into the traced (contiguous) layout at the end of the
forward, and back at the start of the rest.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from graphamp.fx.dialect.ops import returns_alias, written_arguments


@dataclass
class SplitStep:
    """A step graph in two: ``forward(*args[i] for i in forward_args)`` returns the loss and
    the values the rest reads; ``rest(*args[i] for i in rest_args, *forward's outputs)``
    returns the step's outputs after the loss, in order."""

    forward: fx.GraphModule
    rest: fx.GraphModule
    forward_args: list[int]  # indices of the step's arguments the forward reads
    rest_args: list[int]  # and the rest


def split(module: fx.GraphModule) -> SplitStep | None:
    """``module`` (a step graph in the form ``torch.compile`` takes: output 0 the loss) as a
    forward and a rest graph (see the module docstring), or None where it cannot be cut:
    output 0 is not computed from the step's inputs, the rest would read a forward value that is
    not a tensor or that an in-place op wrote into an argument, running the forward first would
    move a write past a reader, or the rest would hold no node that is not a copy.

    The forward holds every ancestor of the loss and each ``getitem`` of a multi-output node
    it holds (a tuple is never passed between the graphs); the rest holds the other nodes in
    their order. A forward value that is a view of a step argument (a transposed weight) is
    not passed: the rest recomputes its views from the argument, because the rest may write
    that argument (``copy_`` of a new parameter) and ``torch.compile`` takes its inputs as
    distinct memory. Writes into arguments stay where they were: the forward's (a batch norm's
    running statistics) run before all of the rest, as in the whole graph, where they precede
    every reader that is not the loss's ancestor."""
    graph = module.graph
    nodes = list(graph.nodes)
    output = nodes[-1]
    results = list(output.args[0])
    loss = results[0]
    forward = forward_nodes(module)
    if forward is None:
        return None
    if not _order_kept(nodes, forward):
        return None
    placeholders = [node for node in nodes if node.op == "placeholder"]
    rest_nodes = [
        node
        for node in nodes
        if node not in forward and node.op not in ("placeholder", "output", "get_attr")
    ]
    if not any(node.target is not torch.ops.aten.copy_.default for node in rest_nodes):
        return None
    # forward values the rest reads (outputs of the step included): views of arguments aside
    read_by_rest: list[fx.Node] = []
    for node in [*rest_nodes, output]:
        for value in node.all_input_nodes:
            if value in forward and value not in read_by_rest:
                read_by_rest.append(value)
    recomputed = [node for node in read_by_rest if _view_of_argument(node)]
    chains = _view_chains(recomputed)
    saved = [loss, *(node for node in read_by_rest if node not in chains and node is not loss)]
    if any(not isinstance(node.meta.get("val"), torch.Tensor) for node in saved):
        return None
    if any(_aliases_argument(node) for node in saved):  # an in-place op's result
        return None

    forward_graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    forward_args = []
    for index, node in enumerate(placeholders):
        if any(user in forward for user in node.users):
            env[node] = forward_graph.node_copy(node)
            forward_args.append(index)
    for node in nodes:
        if node in forward or (node.op == "get_attr" and any(u in forward for u in node.users)):
            env[node] = forward_graph.node_copy(node, env.__getitem__)
    forward_graph.output(tuple(env[node] for node in saved))

    rest_graph = fx.Graph()
    renv: dict[fx.Node, fx.Node] = {}
    rest_args = []
    wanted = set(rest_nodes) | chains | {output}
    for index, node in enumerate(placeholders):
        if any(user in wanted for user in node.users):
            renv[node] = rest_graph.node_copy(node)
            rest_args.append(index)
    for node in saved:
        renv[node] = rest_graph.placeholder(f"saved_{node.name}")
        renv[node].meta = dict(node.meta)
    for node in nodes:
        if (
            node in chains
            or node in rest_nodes
            or (node.op == "get_attr" and any(u in wanted for u in node.users))
        ):
            renv[node] = rest_graph.node_copy(node, renv.__getitem__)
    rest_graph.output(
        type(output.args[0])(renv[v] if isinstance(v, fx.Node) else v for v in results[1:])
    )
    forward_graph.lint()
    rest_graph.lint()
    return SplitStep(
        fx.GraphModule(module, forward_graph),
        fx.GraphModule(module, rest_graph),
        forward_args,
        rest_args,
    )


def forward_nodes(module: fx.GraphModule) -> set[fx.Node] | None:
    """The forward of the step in ``module`` (output 0 the loss): every ancestor of the loss,
    and each ``getitem`` of a multi-output node among them; None where the loss is not
    computed in the graph."""
    nodes = list(module.graph.nodes)
    results = nodes[-1].args[0] if nodes and nodes[-1].op == "output" else None
    loss = results[0] if isinstance(results, (list, tuple)) and results else None
    if not isinstance(loss, fx.Node) or loss.op == "placeholder":
        return None
    forward = ancestors(loss)
    for node in nodes:  # each item of a multi-output forward node goes with it
        if node.target is operator.getitem and node.args[0] in forward:
            forward.add(node)
    return forward


# batch norms, and the position of their ``training`` argument (true: the batch's statistics;
# None: always the batch's). A step traced on a CPU holds the native ones; on a CUDA device
# the trace takes the kernel ``batch_norm`` dispatches to there, ``cudnn_batch_norm`` (on ROCm
# ``miopen_batch_norm``), and a newer trace may keep ``_batch_norm_with_update``.
_BATCH_NORMS: dict[Any, int | None] = {
    torch.ops.aten._native_batch_norm_legit_functional.default: 5,
    torch.ops.aten._native_batch_norm_legit.default: 5,
    torch.ops.aten._native_batch_norm_legit.no_stats: 3,
    torch.ops.aten.native_batch_norm.default: 5,
    torch.ops.aten.batch_norm.default: 5,  # composite: kept whole by some traces
    torch.ops.aten._batch_norm_impl_index.default: 5,
    torch.ops.aten.cudnn_batch_norm.default: 5,
    torch.ops.aten.miopen_batch_norm.default: 5,
    torch.ops.aten._batch_norm_with_update.default: None,
    torch.ops.aten._batch_norm_with_update_functional.default: None,
}


def cut_pays(module: fx.GraphModule) -> bool:
    """Whether the step in ``module`` runs faster cut (:func:`split`) than whole under
    inductor: where its forward normalises with batch statistics. Measured on this project's
    CPU (BENCHMARKS.md, History, issue 42), one thread, interleaved against compile +
    autocast: ResNet-50 cut 0.98x its time, whole 1.12x (inductor put the batch norms'
    forward into the backward's kernels); BERT-base (layer norms, dropout, GELU) cut 0.99x,
    whole 0.86x, and whole it also peaks 280 MiB lower (the cut holds every value the rest
    reads until the rest returns, where inductor frees each after its last reader)."""
    for node in module.graph.nodes:
        if node.target not in _BATCH_NORMS:
            continue
        position = _BATCH_NORMS[node.target]
        if position is None or (len(node.args) > position and node.args[position] is True):
            return True
    return False


def uses_inductor(options: dict[str, Any]) -> bool:
    """Whether ``torch.compile(**options)`` compiles with inductor."""
    return options.get("backend", "inductor") == "inductor"


def max_pool_offsets(module: fx.GraphModule) -> int:
    """Each max pool with indices in ``module`` as inductor's decomposition writes it: the
    window offsets of the maxima (int8) and the indices computed from them; how many were
    rewritten. Inductor decomposes it so in either graph, but only after the cut: cut before,
    the forward would write the int64 indices for the backward (eight times the offsets'
    bytes); cut after, the forward
    saves the offsets and the rest computes the indices, as AOTAutograd's partition of the
    decomposed joint graph has it. The values are the same; a pool inductor would not
    decompose (a window of more than 25 elements) is left as it is."""
    import torch._inductor.lowering  # read by the decomposition, not imported there
    from torch._inductor import decomposition as inductor
    from torch.fx.experimental.proxy_tensor import make_fx

    decompositions = {
        torch.ops.aten.max_pool2d_with_indices.default: inductor.max_pool2d_with_indices,
        torch.ops.aten.max_pool3d_with_indices.default: inductor.max_pool3d_with_indices,
    }
    graph, count = module.graph, 0
    for node in list(graph.nodes):
        decompose = decompositions.get(node.target)
        if decompose is None or not isinstance(node.args[0], fx.Node):
            continue
        value = node.args[0].meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        args, kwargs = node.args[1:], node.kwargs
        if decompose(value, *args, **kwargs) is NotImplemented:
            continue
        traced = make_fx(_applied(decompose, args, kwargs))(value)
        placeholder = next(n for n in traced.graph.nodes if n.op == "placeholder")
        with graph.inserting_before(node):
            results = graph.graph_copy(traced.graph, {placeholder: node.args[0]})
        assert isinstance(results, (tuple, list)), node.format_node()  # (maxima, indices)
        for user in list(node.users):
            index = user.args[1]
            assert isinstance(index, int), user.format_node()  # getitem of the pool's pair
            user.replace_all_uses_with(results[index])
            graph.erase_node(user)
        graph.erase_node(node)
        count += 1
    if count:
        graph.lint()
        module.recompile()
    return count


def random_masks(module: fx.GraphModule) -> int:
    """Each ``bernoulli.p(x, p)`` in ``module`` (a dropout's mask: ``x`` is only a shape) as
    ``rand(shape) < p`` in ``x``'s type (boolean: :mod:`graphamp.fx.training.masks`); how
    many were rewritten. On a CPU inductor runs
    ``bernoulli.p`` as an eager kernel writing into a copy of ``x``, and in a forward graph
    compiled alone (torch 2.13) it fused the mask's users into the kernel that made that copy,
    ahead of the write: every dropout multiplied by ``x``'s contents (zeros for the traced
    ``empty([]).expand(shape)``), so no gradient reached the layers before one and a BERT's
    loss stayed that of uniform logits. ``rand`` is lowered by inductor itself, into the
    kernels that read the mask, as inductor's own dropout is; the masks keep their
    distribution (each element kept with probability ``p``), not eager's random stream."""
    graph, count = module.graph, 0
    for node in list(graph.nodes):
        if node.target is not torch.ops.aten.bernoulli.p or node.kwargs.get("generator"):
            continue
        value, probability = node.meta.get("val"), node.args[1] if len(node.args) > 1 else 0.5
        if not isinstance(value, torch.Tensor) or not isinstance(probability, float):
            continue
        with graph.inserting_before(node):
            uniform = graph.call_function(
                torch.ops.aten.rand.default,
                (list(value.shape),),
                {"dtype": torch.float32, "device": value.device, "pin_memory": False},
            )
            kept = graph.call_function(torch.ops.aten.lt.Scalar, (uniform, probability))
            mask = kept
            if value.dtype != torch.bool:  # a mask in its value's type (not masks.as_bool's)
                mask = graph.call_function(
                    torch.ops.aten._to_copy.default, (kept,), {"dtype": value.dtype}
                )
        uniform.meta["val"] = torch.empty_like(value, dtype=torch.float32)
        kept.meta["val"] = torch.empty_like(value, dtype=torch.bool)
        mask.meta["val"] = value
        node.replace_all_uses_with(mask)
        graph.erase_node(node)  # random: dead-code elimination would keep it
        count += 1
    if count:
        graph.eliminate_dead_code()  # the masks' empty([]).expand(shape)
        graph.lint()
        module.recompile()
    return count


def _applied(
    decompose: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
) -> Callable[[torch.Tensor], Any]:
    """``decompose`` applied to its input and the node's other arguments (a function of one
    tensor, as ``make_fx`` traces)."""
    return lambda x: decompose(x, *args, **kwargs)


def forward_options(options: dict[str, Any]) -> dict[str, Any]:
    """``torch.compile``'s ``options`` for the forward graph: with inductor, the values the
    forward returns to the rest keep the layout inductor gives them (``keep_output_stride``
    off: a convolution's output stays channels-last), as AOTAutograd's saved activations do;
    with inductor's ``keep_output_stride`` on, each was copied into the strides the traced
    graph had, and copied back by the rest. ``mode`` is given as the inductor options it
    stands for (``torch.compile`` takes one of ``mode`` and ``options``)."""
    if not uses_inductor(options):
        return options
    from torch._inductor import list_mode_options

    mode = options.get("mode")
    inductor = {}
    if mode not in (None, "default"):
        inductor = list_mode_options(mode, options.get("dynamic"))
    inductor = {**inductor, **(options.get("options") or {})}
    inductor.setdefault("keep_output_stride", False)
    return {**{k: v for k, v in options.items() if k != "mode"}, "options": inductor}


class CompiledSplitStep:
    """A step graph run as its two compiled graphs: called with the whole graph's arguments,
    it returns what the whole graph returned (a tuple: the loss, then the rest's outputs)."""

    def __init__(
        self, parts: SplitStep, forward: Callable[..., Any], rest: Callable[..., Any]
    ) -> None:
        self.parts, self.forward, self.rest = parts, forward, rest

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        saved = self.forward(*(args[i] for i in self.parts.forward_args))
        return (saved[0], *self.rest(*(args[i] for i in self.parts.rest_args), *saved))

    @property
    def code(self) -> str:
        """The two graphs' Python code, the forward's first (a compiled GraphModule's
        ``code`` is its graph's)."""
        return self.parts.forward.code + self.parts.rest.code


def compiled(
    parts: SplitStep,
    options: dict[str, Any],
    compile_graph: Callable[[fx.GraphModule, dict[str, Any]], Callable[..., Any]],
) -> CompiledSplitStep:
    """The step as its two graphs, each compiled by ``compile_graph`` with ``options`` (the
    forward's as :func:`forward_options` gives them)."""
    forward = compile_graph(parts.forward, forward_options(options))
    return CompiledSplitStep(parts, forward, compile_graph(parts.rest, options))


def ancestors(node: fx.Node, stop: Collection[fx.Node] = ()) -> set[fx.Node]:
    """``node`` and every node it is computed from, placeholders and attributes aside, not
    looking past the nodes of ``stop`` (found, their inputs not followed)."""
    found: set[fx.Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current in found or current.op in ("placeholder", "get_attr"):
            continue
        found.add(current)
        if current is node or current not in stop:
            stack.extend(current.all_input_nodes)
    return found


def _is_view(node: fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and node.target.is_view


def _view_of_argument(node: fx.Node) -> bool:
    """Whether ``node`` is a chain of view ops over a step argument (it aliases its memory)."""
    current: object = node
    while isinstance(current, fx.Node) and _is_view(current):
        current = current.args[0]
    return isinstance(current, fx.Node) and current.op == "placeholder"


def _aliases_argument(node: fx.Node) -> bool:
    """Whether ``node``'s value may be an argument's memory: it is the result of ops that
    return (a view of) one of their inputs, down to a step argument."""
    current: object = node
    while isinstance(current, fx.Node) and current.op == "call_function":
        if not returns_alias(current):
            return False
        current = current.args[0]
    return isinstance(current, fx.Node) and current.op == "placeholder"


def _view_chains(nodes: Sequence[fx.Node]) -> set[fx.Node]:
    """The view nodes from each of ``nodes`` down to its argument."""
    chain: set[fx.Node] = set()
    for node in nodes:
        current: object = node
        while isinstance(current, fx.Node) and _is_view(current):
            chain.add(current)
            current = current.args[0]
    return chain


def _writes(node: fx.Node) -> list[fx.Node]:
    """The values ``node`` writes in place: per its schema, and a batch norm's running
    statistics, which ``cudnn_batch_norm``'s and ``miopen_batch_norm``'s schemas do not mark."""
    written = written_arguments(node)
    if node.target in _BATCH_NORMS:
        stats = node.args[3:5]  # running_mean, running_var in every batch norm's schema
        written += [value for value in stats if isinstance(value, fx.Node)]
    return written


def _order_kept(nodes: list[fx.Node], forward: set[fx.Node]) -> bool:
    """Whether running the forward nodes before the rest keeps every write into a value
    where it was against the value's other readers and writers: each node of the forward
    that touches a written value comes before each node of the rest that touches it."""
    position = {node: index for index, node in enumerate(nodes)}
    for written in {value for node in nodes for value in _writes(node)}:
        touching, pending = [written], [written]
        while pending:  # its readers and writers, through views of it
            for user in pending.pop().users:
                touching.append(user)
                if _is_view(user):
                    pending.append(user)
        last_forward = max((position[n] for n in touching if n in forward), default=-1)
        first_rest = min(
            (position[n] for n in touching if n not in forward and n.op != "placeholder"),
            default=len(nodes),
        )
        if last_forward > first_rest:
            return False
    return True
