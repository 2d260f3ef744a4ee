"""A captured step graph in the form an eager step runs and in the form ``torch.compile``
takes.

The captured graph is functional aten ops. An eager step runs it op by op from Python, so the
passes here make it cheaper to run without changing a value: dropout masks are held as
booleans and a dropout's backward is one kernel (:mod:`graphamp.fx.training.masks`), on CUDA
a float16 softmax in float32 is one kernel each way (:mod:`graphamp.fx.training.softmax_casts`)
and a cast to float32 read by one elementwise op with a float32 operand is left to the op's
type promotion (:mod:`graphamp.fx.training.promotion`), forward values one cheap op away from values
the backward reads anyway are computed again there instead of held
(:mod:`graphamp.fx.training.recompute`), on a CPU a cross-entropy head runs a block of rows
at a time (:mod:`graphamp.fx.training.loss_head`), on a CPU Adam's last formula is
the one ``addcdiv`` torch.optim calls (:mod:`graphamp.fx.training.step_size`), elementwise
ops and the kept parameters' updates write in place, on CUDA after one read of the finite
check on the host (:mod:`graphamp.fx.training.in_place`),
the unscale joins the fused finite check, on a CPU the optimizer's update runs parameter by
parameter, in chunks that fit in a cache (:mod:`graphamp.fx.training.locality`), each
optimizer formula runs as one foreach op over all parameters (of a chunk)
(:mod:`graphamp.fx.training.foreach`), and ops are called through PyTorch's Python bindings
(:mod:`graphamp.fx.training.bindings`).
``torch.compile`` fuses better from the functional graph, so :func:`for_compile` undoes the
passes that write in place, group, block or reorder, in the reverse order, and puts the traced form
of the guard and the check in. The boolean masks, the dropout backward as one op (inductor
decomposes it into the kernel that reads it) and the values computed again stay: inductor,
given the step as one graph (not a graph it differentiates itself), holds between forward and
backward exactly what the graph holds, and with them BERT-base's compiled step peaked 230 MiB
lower at batch 32 in the same time (BENCHMARKS.md, History, issue 42); the weights' casts a
CPU's eager step computes again by default are held again (``recompute_casts=True`` keeps
them computed again there too). It then writes each new
state into the argument it replaces (:func:`write_back`), so the compiled step updates its
state where it lives, as the eager step and torch.optim do.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import fx

from graphamp.fx.dialect import lowering
from graphamp.fx.distributed import data_parallel
from graphamp.fx.training import (
    bindings,
    foreach,
    in_place,
    locality,
    loss_head,
    masks,
    promotion,
    recompute,
    softmax_casts,
    step_size,
)


def for_eager(module: fx.GraphModule, recompute_casts: bool | None = None) -> fx.GraphModule:
    """``module`` made cheaper to run op by op; after any pass that reorders nodes (they read
    the final order). ``recompute_casts``: the weights' casts and float32 copies of
    low-precision values computed again in the backward too (:func:`recompute.saved_less`'s
    ``casts``); None: in the eager step on a CPU only (there it cost no consistent time; on a
    GPU it is only a cast more of every weight), and
    ``torch.compile`` gets them held (:func:`recompute.held_again`)."""
    cuda = on_cuda(module)
    without_unread(module)
    masks.as_bool(module)
    masks.fused_backward(module)
    if cuda:
        softmax_casts.fused(module)
        promotion.promoted(module)
    casts = not cuda if recompute_casts is None else recompute_casts
    recompute.saved_less(module, casts=casts, compiled_too=recompute_casts is True)
    if not cuda:  # measured on a CPU only
        loss_head.chunked(module)
    step_size.with_addcdiv(module)
    in_place.guarded_updates(module)
    # CUDA's row-wise backward kernels into their gradient: checked by tools/gpu/cuda_paths.py
    in_place.in_place(module, into_first_on=("cpu", "cuda") if cuda else ("cpu",))
    in_place.copied_back_in_place(module)
    in_place.unscale_in_check(module)
    if cuda:
        in_place.guards_read_once(module)
    locality.by_parameter(module)
    foreach.grouped(module)
    bindings.with_bindings(module)
    return module


def on_cuda(module: fx.GraphModule) -> bool:
    """Whether ``module``'s inputs live on a CUDA device (the step runs there): the passes
    for CUDA's kernels and its queue run then."""
    for node in module.graph.nodes:
        value = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor):
            return value.device.type == "cuda"
    return False


def without_unread(module: fx.GraphModule) -> int:
    """Erase the aten ops of ``module`` whose values nothing reads and that do nothing else:
    no argument written, nothing drawn from a generator (erasing a draw would move every
    later one); how many. The traced step keeps some (BERT's SDPA traced on a CPU casts each
    layer's dropped probabilities to bfloat16 and reads the cast nowhere), and an eager step
    runs every node it has; ``torch.compile`` drops them itself."""
    erased = 0
    for node in reversed(list(module.graph.nodes)):
        op = node.target
        if node.op != "call_function" or node.users or not isinstance(op, torch._ops.OpOverload):
            continue
        # an op returning nothing is there for what it does (an assertion)
        if op.namespace != "aten" or op._schema.is_mutable or not op._schema.returns:
            continue
        if torch.Tag.nondeterministic_seeded in op.tags:
            continue
        module.graph.erase_node(node)
        erased += 1
    if erased:
        module.graph.lint()
        module.recompile()
    return erased


def for_compile(
    module: fx.GraphModule, written_back: Sequence[tuple[int, str]] = ()
) -> fx.GraphModule:
    """``module`` (an eager step graph) in its functional form: no binding, no foreach call,
    the update in the traced order, no in-place collective or update, the step guard as
    ``torch.where`` and the finite check as reductions, which inductor functionalises and
    fuses (boolean dropout masks and values computed again in the backward kept: see the
    module docstring); then the state ``written_back`` names written into its arguments
    (:func:`write_back`)."""
    bindings.without_bindings(module)
    foreach.ungrouped(module)
    locality.traced_order(module)
    data_parallel.without_in_place_collectives(module)
    in_place.functional(module)
    recompute.held_again(module)  # after in_place.functional: the values held are unwritten
    step_size.without_addcdiv(module)
    loss_head.unfused(module)
    softmax_casts.unfused(module)
    promotion.widened(module)
    in_place.guards_read_on_device(module)
    lowering.with_traced_guards(module)
    return write_back(module, written_back)


def write_back(module: fx.GraphModule, pairs: Sequence[tuple[int, str]]) -> fx.GraphModule:
    """Each output ``index`` of ``pairs`` (new parameters, optimizer and loss-scaling state)
    copied into the placeholder named beside it, the state it replaces, and that placeholder
    returned in its place. ``torch.compile`` keeps such input mutations in the graph it gives
    inductor, which then stores each new value into the state's own memory: without them every
    compiled step wrote its parameters and optimizer state into fresh buffers as large as they
    are, the old ones alive until the call returned. An output is left as it is where it is
    the placeholder itself (state a graph does not change) or differs from it in shape, type
    or strides."""
    graph = module.graph
    placeholders = {node.name: node for node in graph.nodes if node.op == "placeholder"}
    output = next(node for node in graph.nodes if node.op == "output")
    results = list(output.args[0])
    written = set()
    for index, name in pairs:
        kept, new = placeholders[name], results[index]
        if new is kept or name in written or not _same_tensor_type(kept, new):
            continue
        with graph.inserting_before(output):
            copied = graph.call_function(torch.ops.aten.copy_.default, (kept, new))
        copied.meta["val"] = kept.meta.get("val")
        results[index] = copied
        written.add(name)
    if written:
        output.args = (type(output.args[0])(results),)
        graph.lint()
        module.recompile()
    return module


def _same_tensor_type(a: fx.Node, b: fx.Node) -> bool:
    have, want = a.meta.get("val"), b.meta.get("val") if isinstance(b, fx.Node) else None
    return (
        isinstance(have, torch.Tensor)
        and isinstance(want, torch.Tensor)
        and have.shape == want.shape
        and have.dtype == want.dtype
        and have.device == want.device
        and have.stride() == want.stride()
    )
