"""How a training step differentiates its forward pass, and through what it traces.

The step is traced with ``make_fx`` over ``torch.func.functionalize`` (the forward's in-place
buffer updates become functional ops and one copy back) and ``torch.func.grad``. In torch 2.13
those functorch transforms cannot enter a higher-order op: ``torch.cond``, ``torch.while_loop``
and ``torch.map`` have no rule for them (``KeyError: TransformType.Grad``). What AOTAutograd
does instead works: ``torch.autograd.grad`` under Python functionalization
(``FunctionalTensorMode``), which differentiates each call through its own autograd rule: a
cond's backward is another cond over the branches' backward graphs, a map's another map. A
while_loop's backward runs its body backward as many times as the forward ran, a count it
reads from a tensor, so such a step is traced with symbolic shapes (the count is then a
symbol, not a value the tracer would have to know). A step torch cannot trace through such
an op is one :class:`GraphampError` naming the op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from graphamp.errors import GraphampError
from graphamp.fx.dialect import hops
from graphamp.fx.dialect.ops import library_of

Gradients = Callable[..., tuple[dict[str, torch.Tensor], Any]]
# ``with torch.no_grad():`` in a forward torch.export captured: its body runs without grad
_GRAD_MODE = torch.ops.higher_order.wrap_with_set_grad_enabled


def higher_order_ops(module: fx.GraphModule) -> list[str]:
    """The higher-order ops ``module`` calls (in its bodies too), in graph order."""
    found: list[str] = []
    for graph_module in module.modules():
        if isinstance(graph_module, fx.GraphModule):
            for node in graph_module.graph.nodes:
                if hops.is_higher_order(node) and str(node.target) not in found:
                    found.append(str(node.target))
    return found


def through_autograd(module: fx.GraphModule) -> bool:
    """Whether a step through ``module`` is differentiated with ``torch.autograd.grad`` under
    Python functionalization rather than torch.func's transforms: it calls a higher-order op
    (see the module docstring) or a custom op (``torch.library``, outside aten and prims:
    float8's mark, :mod:`graphamp.fx.dialect.float8`; transformers' MoE experts,
    ``transformers::grouped_mm_fallback``), whose autograd formula torch.func cannot enter
    ("an autograd.Function with functorch transforms ... must override setup_context")."""
    if higher_order_ops(module):
        return True
    return any(library_of(node) for node in module.graph.nodes)


def tracing_mode(module: fx.GraphModule) -> Literal["fake", "symbolic"]:
    """``make_fx``'s tracing mode for a step through ``module``: on fake tensors, as for any
    step, unless it calls a higher-order op other than cond, map and a ``no_grad`` block
    (``wrap_with_set_grad_enabled``: a teacher or target computed without gradient; see the
    module docstring; a scan, kept whole, also needs symbolic shapes to be traced, and an
    eager step's passes read shapes as numbers). Neither runs a kernel: a trace on real
    tensors would compute a whole step of its own, holding its forward's values until its
    backward beside copies of the state, so the first call would need more memory than
    every later one."""
    plain = {str(hops.COND), str(hops.MAP), str(_GRAD_MODE)}
    return "symbolic" if set(higher_order_ops(module)) - plain else "fake"


def grad(module: fx.GraphModule, f: Callable[..., tuple[torch.Tensor, Any]]) -> Gradients:
    """``torch.func.grad(f, has_aux=True)`` for a forward through ``module``: the gradients of
    ``f(trainable, rest)[0]`` with respect to ``trainable`` (a dict), and ``f``'s aux value."""
    if not through_autograd(module):
        return torch.func.grad(f, has_aux=True)

    def gradients(
        trainable: dict[str, torch.Tensor], rest: dict[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], Any]:
        leaves = {name: value.detach().requires_grad_() for name, value in trainable.items()}
        with torch.enable_grad():
            value, aux = f(leaves, rest)
            found = torch.autograd.grad(value, list(leaves.values()), allow_unused=True)
        # an unused parameter's gradient is zeros, as torch.func.grad gives it
        pairs = zip(found, leaves.values(), strict=True)
        values = [g if g is not None else torch.zeros_like(p) for g, p in pairs]
        detached = pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, aux)
        return dict(zip(leaves, values, strict=True)), detached

    return gradients


def unreached(
    module: fx.GraphModule,
    loss: Callable[[dict[str, torch.Tensor], list[Any]], torch.Tensor],
    tensors: dict[str, torch.Tensor],
    names: list[str],
    batch: list[Any],
    faked: bool = False,
    outside: dict[int, str] | None = None,
) -> frozenset[str]:
    """The ``names`` among ``tensors`` that ``loss(tensors, batch)`` (a forward through
    ``module``) has no gradient path from: those whose gradient autograd leaves None, where
    ``torch.func.grad`` and the step's gradients make it zeros, which an optimizer applies.
    Found by tracing autograd as a step is traced, so nothing is computed; ``faked``: the
    arguments are fake tensors of one mode already. ``outside``: the model's own trainable
    parameters by ``id``, which the loss must not read itself (one GraphampError naming them:
    the step differentiates through ``tensors`` only, so it would never train them)."""
    found: list[str] = []
    read: list[str] = []

    def probe(*args: Any) -> list[torch.Tensor]:
        given = dict(zip(tensors, args[: len(tensors)], strict=True))
        leaves = {name: given[name].detach().requires_grad_() for name in names}
        with torch.enable_grad():
            value = loss({**given, **leaves}, list(args[len(tensors) :]))
            if not value.requires_grad:
                found.extend(names)
                return [value]
            read.extend(_leaves_read(value, outside or {}))
            grads = torch.autograd.grad(value, list(leaves.values()), allow_unused=True)
        found.extend(name for name, g in zip(leaves, grads, strict=True) if g is None)
        return [value.detach()]

    _traced(module, probe, [*tensors.values(), *batch], faked)
    if read:
        raise GraphampError(
            f"loss_fn reads the model's parameter {', '.join(map(repr, read[:3]))} itself, not "
            "through the model's forward: the step differentiates the loss through forward's "
            "parameters only and would never train it (eager autograd does): compute it in "
            "forward, or leave it out of the optimizer"
        )
    return frozenset(found)


def _leaves_read(value: torch.Tensor, known: dict[int, str]) -> list[str]:
    """The names of the ``known`` leaf tensors ``value``'s autograd graph accumulates into."""
    names: list[str] = []
    seen: set[int] = set()
    stack = [value.grad_fn]
    while stack:
        function = stack.pop()
        if function is None or id(function) in seen:
            continue
        seen.add(id(function))
        variable = getattr(function, "variable", None)  # an AccumulateGrad: a leaf
        if variable is not None and id(variable) in known:
            names.append(known[id(variable)])
        stack.extend(following for following, _ in function.next_functions)
    return sorted(names)


def functionalize(module: fx.GraphModule, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.func.functionalize(fn, remove="mutations")`` for a step through ``module``:
    ``fn`` traced with functional ops only, the arguments it wrote copied back at the end."""
    if not through_autograd(module):
        return torch.func.functionalize(fn, remove="mutations")
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

    def unwrap(value: FunctionalTensor) -> torch.Tensor:
        torch._sync(value)
        return torch._from_functional_tensor(value.elem)

    def functional(*args: Any) -> Any:
        written: list[tuple[torch.Tensor, torch.Tensor]] = []
        exclude = torch._C._ExcludeDispatchKeyGuard(
            torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
        )
        with exclude, FunctionalTensorMode():
            wrapped = pytree.tree_map_only(torch.Tensor, FunctionalTensor.to_functional, args)
            result = pytree.tree_map_only(FunctionalTensor, unwrap, fn(*wrapped))
            for original, value in zip(args, wrapped, strict=True):
                if isinstance(value, FunctionalTensor):
                    torch._sync(value)
                    # attr-defined: a binding torch's stubs leave out
                    if torch._functionalize_has_data_mutation(value.elem):  # type: ignore[attr-defined]
                        written.append((original, unwrap(value)))
        for original, value in written:  # functionalize's epilogue: one copy per argument
            original.copy_(value)
        return result

    return functional


def compiled(module: fx.GraphModule, options: dict[str, Any]) -> Callable[..., Any]:
    """``torch.compile(module, **options)``; a step graph calling a while_loop (whose backward
    reads its iteration count from a tensor) runs it with dynamo capturing such scalars."""
    compiled_module = torch.compile(module, **options)
    if str(hops.WHILE_LOOP) not in higher_order_ops(module):
        return compiled_module

    def run(*args: Any) -> Any:
        with torch._dynamo.config.patch(capture_scalar_outputs=True):
            return compiled_module(*args)

    return run


def trace(module: fx.GraphModule, fn: Callable[..., Any], args: list[Any]) -> fx.GraphModule:
    """``fn`` (a step through ``module``) traced functionally on ``args``; an error raised in
    a higher-order op's backward is one line naming the op."""
    return without_leaf_detaches(_traced(module, functionalize(module, fn), args))


def _traced(
    module: fx.GraphModule, fn: Callable[..., Any], args: list[Any], faked: bool = False
) -> fx.GraphModule:
    """``fn`` (through ``module``) traced with ``make_fx`` in the step's tracing mode."""
    try:
        mode = tracing_mode(module)
        if mode == "fake" and not faked:
            args = _fakes(args)
        return make_fx(fn, tracing_mode=mode)(*args)
    except GraphampError:
        raise
    except Exception as error:
        ops = ", ".join(f"torch.ops.higher_order.{op}" for op in higher_order_ops(module))
        if not ops:
            raise
        lines = str(error).strip().splitlines() or [""]
        raise GraphampError(
            f"train_step: torch could not trace the step through the forward's {ops}: "
            f"{type(error).__name__}: {lines[0][:300]}"
        ) from error


def _fakes(args: list[Any]) -> list[Any]:
    """``args``' tensors as fake tensors of one mode, which a trace reads and writes without
    touching the real ones; the mode reads tensors the forward module holds (lifted
    constants) as constants, as the sharded step's does."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    return [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]


def without_leaf_detaches(module: fx.GraphModule) -> fx.GraphModule:
    """``module`` without the ``detach`` of each argument that ``torch.autograd.grad``'s
    leaves leave in the trace: an identity in a graph that runs without autograd, which
    would hide the argument's readers (a sharded step gathers a parameter in the low type
    only when every reader casts it there)."""
    changed = False
    for node in list(module.graph.nodes):
        if node.target is torch.ops.aten.detach.default and node.args[0].op == "placeholder":
            node.replace_all_uses_with(node.args[0])
            module.graph.erase_node(node)
            changed = True
    if changed:
        module.graph.lint()
        module.recompile()
    return module
