"""An eager step graph's aten calls made through PyTorch's Python bindings.

A traced graph calls each op as ``torch.ops.aten.mm.default(a, b)``: the overload object's
``__call__`` and the dispatcher's boxed argument parsing. Eager PyTorch code calls
``torch.mm(a, b)``, a binding generated from the same schema that parses its arguments in C++
and calls the same op with less Python on the way, which adds up where a step graph makes
several hundred calls and autograd's engine makes the backward's from C++.

:func:`with_bindings` gives each aten node the binding of its op's own name (``torch.mm``,
``torch._C._nn.gelu``, ``Tensor.view``...) where calling that binding on meta tensors like the
node's inputs dispatches exactly the node's op, once: the same overload, so the same kernel
and values. Ops without such a binding (``_to_copy``, most backward ops) keep their overload.
``torch.compile`` gets the overloads back (:func:`without_bindings`), as the other eager-only
passes undo theirs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode

_OVERLOAD_META = "graphamp_overload"  # on a node calling a binding: the op it called before
# Where PyTorch's generated bindings live, in the order they are looked up: the torch.*
# functions, torch.nn.functional's, torch.linalg's and torch.special's, then Tensor methods.
_NAMESPACES = (
    torch._C._VariableFunctions,
    torch._C._nn,
    torch._C._linalg,  # type: ignore[attr-defined]  # (these two modules: not in torch's stubs)
    torch._C._special,  # type: ignore[attr-defined]
    torch._C.TensorBase,
)


def with_bindings(module: fx.GraphModule) -> int:
    """Call each aten op of ``module`` through its binding where that dispatches exactly
    the op (see the module docstring); how many nodes now do."""
    made = 0
    for node in module.graph.nodes:
        op = node.target
        if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
            continue
        binding = _binding(op)
        if binding is None or not _dispatches_exactly(binding, op, node):
            continue
        node.meta[_OVERLOAD_META] = op
        node.target = binding
        made += 1
    if made:
        module.recompile()
    return made


def without_bindings(module: fx.GraphModule) -> fx.GraphModule:
    """``module`` with every node :func:`with_bindings` changed calling its overload again."""
    changed = False
    for node in module.graph.nodes:
        op = node.meta.pop(_OVERLOAD_META, None)
        if op is not None:
            node.target = op
            changed = True
    if changed:
        module.recompile()
    return module


def overload(node: fx.Node) -> Any:
    """The op ``node`` calls: its aten overload, through a binding or not; else its target."""
    return node.meta.get(_OVERLOAD_META, node.target)


def _binding(op: torch._ops.OpOverload) -> Any:
    """The Python binding named as ``op``, where PyTorch has one."""
    if op.namespace != "aten":
        return None
    name = op.overloadpacket.__name__
    return next((getattr(s, name) for s in _NAMESPACES if hasattr(s, name)), None)


class _Recorder(TorchDispatchMode):
    """Records the ops dispatched under it, with their arguments as the dispatcher hands
    them on (defaults filled in by the schema)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls.append((func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def _dispatches_exactly(binding: Any, op: torch._ops.OpOverload, node: fx.Node) -> bool:
    """Whether ``binding``, called with ``node``'s arguments (its tensors as meta tensors of
    their shapes, strides and types), dispatches what ``op`` does: ``op`` alone, with the same
    arguments (a binding may have other defaults: ``torch._C._nn.mse_loss``'s reduces nothing)."""
    try:
        args, kwargs = _on_meta(node.args), _on_meta(dict(node.kwargs))
        with _Recorder() as through_binding:
            binding(*args, **kwargs)
        with _Recorder() as through_op:
            op(*args, **kwargs)
    except Exception:  # no meta kernel, an argument the binding parses otherwise: keep op
        return False
    return len(through_op.calls) == 1 and _same(through_binding.calls, through_op.calls)


def _same(a: Any, b: Any) -> bool:
    """Structural equality, tensors by identity."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


class _NoExample(Exception):
    """A node input whose shape and type are not known."""


def _on_meta(value: Any) -> Any:
    """``value`` with each node replaced by an empty meta tensor like its value, and each
    device by the meta device."""
    if isinstance(value, fx.Node):
        example = value.meta.get("val")
        if not isinstance(example, torch.Tensor):
            raise _NoExample(value.name)
        return torch.empty_strided(
            example.shape, example.stride(), dtype=example.dtype, device="meta"
        )
    if isinstance(value, torch.device):
        return torch.device("meta")
    if isinstance(value, list | tuple):
        return type(value)(_on_meta(item) for item in value)
    if isinstance(value, dict):
        return {key: _on_meta(item) for key, item in value.items()}
    return value
