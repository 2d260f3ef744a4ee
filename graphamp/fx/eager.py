"""A captured step graph in the form an eager step runs and in the form ``torch.compile``
takes.

The captured graph is functional aten ops. An eager step runs it op by op from Python, so the
passes here make it cheaper to run without changing a value: elementwise ops and the kept
parameters' updates write in place (:mod:`graphamp.fx.in_place`), the unscale joins the fused
finite check, each optimizer formula runs as one foreach op over all parameters
(:mod:`graphamp.fx.foreach`), and ops are called through PyTorch's Python bindings
(:mod:`graphamp.fx.bindings`). ``torch.compile`` plans its own buffers and fuses better from
the functional graph, so :func:`for_compile` undoes each of them, in the reverse order, and
puts the traced form of the guard and the check in.
"""

from __future__ import annotations

from torch import fx

from graphamp.fx import bindings, distributed, foreach, in_place, lowering


def for_eager(module: fx.GraphModule) -> fx.GraphModule:
    """``module`` made cheaper to run op by op; after any pass that reorders nodes (they read
    the final order)."""
    in_place.guarded_updates(module)
    in_place.in_place(module)
    in_place.unscale_in_check(module)
    foreach.grouped(module)
    bindings.with_bindings(module)
    return module


def for_compile(module: fx.GraphModule) -> fx.GraphModule:
    """``module`` (an eager step graph) in its functional form: no binding, no foreach call,
    no in-place collective or update, the step guard as ``torch.where`` and the finite check
    as reductions, which inductor functionalises and fuses."""
    bindings.without_bindings(module)
    foreach.ungrouped(module)
    distributed.without_in_place_collectives(module)
    in_place.functional(module)
    return lowering.with_traced_guards(module)
