"""Capturing a PyTorch model as a torch.fx graph in torch.export's training IR.

Its op names (``linear``, ``matmul``, ``layer_norm``, ...) are the ones PyTorch's autocast
lists name, and its nodes carry their module path (``nn_module_stack``), which name rules match.

Shapes: ``dynamic_shapes`` has torch.export's meaning. Left out, the first dimension of every
input tensor of two or more dimensions is automatic (``Dim.AUTO``: dynamic where the model
allows it, else static), so a converted module runs at any batch size; the inputs where it
stayed static are reported (:func:`static_batches`). ``"static"`` keeps every dimension as
traced.

What a module needs to be exported again (:mod:`graphamp.fx.dialect.pt2`) travels with it in
``module.meta["graphamp"]`` (:class:`Captured`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

from graphamp.errors import GraphampError
from graphamp.fx.dialect.attention import drop_all_true_masks

STATIC = "static"
_TORCH = str(Path(torch.__file__).parent)
_GRAPHAMP = str(Path(__file__).parent.parent)


@dataclass
class Captured:
    """The example inputs a module was captured on (as the caller passed them) and the ranges
    of its symbolic dimensions (symbol -> (lowest, highest or None)); ``plan`` once converted."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    ranges: dict[str, tuple[int, int | None]]
    plan: Any = None
    static_batches: list[str] = field(default_factory=list)
    static_cause: str = ""  # why they are static, where torch.export's usual causes are not
    # custom torch.autograd.Function classes the forward applied (traced through their
    # forward: a graph differentiated later never calls their backward)
    autograd_functions: list[str] = field(default_factory=list)


def example_args(value: object) -> tuple[Any, ...] | None:
    """``example_inputs`` as torch.export takes them: a tuple of the module's positional
    arguments. One tensor is the tuple of it (a module of one input, the common case); any
    other value is refused, since it could be one argument or several."""
    if value is None or isinstance(value, tuple):
        return value
    if isinstance(value, torch.Tensor):
        return (value,)
    hint = "tuple(x) if its items are the arguments, " if isinstance(value, list) else ""
    raise GraphampError(
        f"example_inputs: a tuple of the module's positional arguments (or one tensor), got a "
        f"{type(value).__name__} x: pass {hint}(x,) if x is the one argument"
    )


def capture(
    model: object,
    example_inputs: tuple[Any, ...] | None,
    example_kwargs: dict[str, Any] | None = None,
    dynamic_shapes: Any = None,
) -> fx.GraphModule:
    """A fresh GraphModule in torch.export's training IR; ``model`` (a module or a program; any
    other object is refused in one line) is not changed."""
    static_cause = ""  # why the batch stayed static where torch.export's usual causes are not
    if isinstance(model, torch.export.ExportedProgram):
        if dynamic_shapes is not None:
            raise GraphampError(
                "dynamic_shapes: an ExportedProgram's shapes were fixed when it was exported"
            )
        program = model
    elif isinstance(model, nn.Module):
        example_inputs = example_args(example_inputs)
        with _functions_applied() as functions:
            program, static_cause = _export(model, example_inputs, example_kwargs, dynamic_shapes)
    else:
        raise GraphampError(
            f"expected an nn.Module, GraphModule or ExportedProgram, got {type(model).__name__}"
        )
    module = program.module()
    drop_all_true_masks(module)
    args, kwargs = program.example_inputs or ((), {})
    batches: list[str] = []
    if isinstance(model, nn.Module):
        args, kwargs = tuple(example_inputs or ()), dict(example_kwargs or {})
        batches = static_batches(program) if dynamic_shapes is None else []
    module.meta["graphamp"] = Captured(
        args,
        kwargs,
        ranges(program),
        static_batches=batches,
        static_cause=static_cause,
        autograd_functions=functions if isinstance(model, nn.Module) else [],
    )
    return module


@contextlib.contextmanager
def _functions_applied() -> Iterator[list[str]]:
    """The custom ``torch.autograd.Function`` classes applied while the block runs (in call
    order, once each), by their qualified names."""
    applied: list[str] = []
    base = torch.autograd.Function
    original = base.__dict__["apply"]

    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        name = f"{cls.__module__}.{cls.__qualname__}"
        # (torch.library's ops apply the backward they register: the graph keeps the op whole)
        if name not in applied and not cls.__module__.startswith("torch._library"):
            applied.append(name)
        return original.__func__(cls, *args, **kwargs)

    base.apply = classmethod(apply)  # type: ignore[method-assign, assignment]
    try:
        yield applied
    finally:
        base.apply = original  # type: ignore[method-assign]


def _export(
    model: nn.Module,
    args: tuple[Any, ...] | None,
    kwargs: dict[str, Any] | None,
    dynamic_shapes: Any,
) -> tuple[torch.export.ExportedProgram, str]:
    """The module exported, and why its batch dimensions are static where the default
    specification could not be used ("" where it was)."""
    name = type(model).__name__
    static_cause = ""
    if args is None and not kwargs:
        raise GraphampError(
            f"{name}: example_inputs (or example_kwargs) are needed to capture the module "
            "with torch.export"
        )
    if "transformers" in sys.modules:  # a Hugging Face model's caches are pytree nodes
        from graphamp.fx.dialect.hf import register_caches

        register_caches()
    args, kwargs = tuple(args or ()), dict(kwargs or {})
    defaulted = dynamic_shapes is None
    if defaulted:
        dynamic_shapes = _batch_dims(model, args, kwargs)
    elif isinstance(dynamic_shapes, str):
        if dynamic_shapes != STATIC:
            raise GraphampError(
                f"dynamic_shapes={dynamic_shapes!r}: give torch.export's specification (a dict "
                f"or tuple of dimensions per input) or {STATIC!r}"
            )
        dynamic_shapes = None
    else:
        _check_indices(model, args, kwargs, dynamic_shapes)
    printed = io.StringIO()
    try:
        with _quiet(_TORCH_LOGGERS), contextlib.redirect_stderr(printed):
            try:
                program = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes)
            except AssertionError as exc:
                # torch.export refuses any specification where a non-tensor keyword lands in
                # the module's **kwargs (HF's output_hidden_states=True; torch 2.13: "Must
                # provide a tree_name"): the default is captured static instead, and the
                # StaticShapeWarning names the inputs that are
                if not defaulted or "tree_name" not in str(exc):
                    raise
                program = torch.export.export(model, args, kwargs)
                static_cause = (
                    "torch.export takes no dynamic dimension where a non-tensor keyword goes "
                    "to the module's **kwargs: leave it out of example_kwargs (a Hugging Face "
                    "model reads such flags from its config too)"
                )
    except Exception as exc:  # torch.export raises many types; say what and where in one line
        # torch prints the graph traced so far before raising: the error says where instead
        _replay(printed.getvalue(), drop=str(getattr(exc, "partial_fx_graph", "")))
        if isinstance(exc, GraphampError):
            raise
        raise GraphampError(capture_error(name, exc)) from None
    _replay(printed.getvalue())
    return program, static_cause


def _replay(text: str, drop: str = "") -> None:
    """Write to stderr what torch printed there during the capture, less ``drop``."""
    if drop:
        text = text.replace(drop, "")
    if text.strip():
        sys.stderr.write(text.strip("\n") + "\n")


# torch logs each automatic dimension it fixes and, before raising, the graph traced so far
# (and the fake tensors' traceback of a shape error: "failed while attempting to run meta"):
# convert warns once naming the dimensions, and a failure is one line (capture_error).
_TORCH_LOGGERS = (
    "torch._export.non_strict_utils",
    "torch.fx.experimental.symbolic_shapes",
    "torch._subclasses.fake_tensor",
)


@contextlib.contextmanager
def _quiet(names: tuple[str, ...]) -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in names]
    previous = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)  # what they log at ERROR is the error raised next
    try:
        yield
    finally:
        for logger, level in zip(loggers, previous, strict=True):
            logger.setLevel(level)


def _batch_dims(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The default: ``Dim.AUTO`` for the first dimension of every input tensor of two or more
    dimensions (caches inside the inputs included), every other dimension static."""
    from torch.export import Dim, ShapesCollection

    shapes = ShapesCollection()
    for leaf in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and leaf.dim() >= 2:
            shapes[leaf] = {0: Dim.AUTO}
    try:
        return shapes.dynamic_shapes(model, args, kwargs)
    except Exception as exc:  # the inputs do not bind to forward's signature
        first = first_line(exc)
        raise GraphampError(f"{type(model).__name__}: the example inputs: {first}") from None


def _check_indices(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], dynamic_shapes: Any
) -> None:
    """Refuse a dimension index past a tensor's last (torch.export ignores it silently);
    torch.export checks the rest of the specification itself."""
    from torch.export.dynamic_shapes import _combine_args, _tree_map_with_path

    def check(path: Any, value: Any, shape: Any) -> None:
        if isinstance(value, torch.Tensor) and isinstance(shape, dict):
            for index in shape:
                if not isinstance(index, int) or not 0 <= index < value.dim():
                    raise GraphampError(
                        f"dynamic_shapes{torch.utils._pytree.keystr(path)}: no dimension "
                        f"{index!r} in an input of shape {tuple(value.shape)}"
                    )

    try:
        by_name = _combine_args(model, args, kwargs)
        combined: dict[str, Any] | tuple[Any, ...] | list[Any] = by_name
        if isinstance(dynamic_shapes, tuple | list):
            combined = type(dynamic_shapes)(by_name.values())
        _tree_map_with_path(check, combined, dynamic_shapes, tree_name="inputs")
    except GraphampError:
        raise
    except Exception:  # a structure that does not match: torch.export says how
        return


def capture_error(name: str, exc: BaseException) -> str:
    """One line for an exception torch.export raised: what, where in the model's code, and
    what to do about a branch on a tensor's value."""
    where = _model_frame(exc)
    if isinstance(exc, torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode):
        at = f" at {where}" if where else ""
        return (
            f"{name}: torch.export cannot capture Python control flow on a tensor's value{at}: "
            "write the branch with torch.cond (or the loop with torch.while_loop), or convert "
            "the parts of the model around it"
        )
    if _is_dynamic_shapes_error(exc):
        # a violated constraint's first line only names the dimension; its first bullet says why
        why = [ln.strip()[2:] for ln in str(exc).splitlines() if ln.strip().startswith("- ")]
        reason = f": {why[0].split('. ')[0]}" if why else ""
        return f"dynamic_shapes: {first_line(exc).rstrip('.!')}{reason}"
    at = f" (at {where})" if where else ""
    return f"{name}: torch.export could not capture it{at}: {first_line(exc)}"


def _is_dynamic_shapes_error(exc: BaseException) -> bool:
    from torch._dynamo.exc import UserError, UserErrorType
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

    if isinstance(exc, ConstraintViolationError):
        return True
    if isinstance(exc, UserError) and exc.error_type in (
        UserErrorType.INVALID_INPUT,
        UserErrorType.CONSTRAINT_VIOLATION,
    ):
        return True
    return "dynamic_shapes" in first_line(exc)


def first_line(exc: BaseException) -> str:
    """An exception's first line of text (its type's name where it has none), cut at 300
    characters and before torch's 'For more information' pointer."""
    text = str(exc).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return line.split(" For more information")[0][:300]


def _model_frame(exc: BaseException) -> str | None:
    """``file:line (`code`)`` of the innermost frame of the traceback outside torch and
    graphamp: the line of the model's code torch.export stopped at."""
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith((_TORCH, _GRAPHAMP)) and "<" not in frame.filename
    ]
    if not frames:
        return None
    frame = frames[-1]
    code = f" (`{frame.line.strip()}`)" if frame.line else ""
    return f"{frame.filename}:{frame.lineno}{code}"


def is_static(size: int | torch.SymInt) -> bool:
    """Whether a traced size is a number (a symbol the capture fixed counts as one)."""
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    return is_concrete_int(size)


def ranges(program: torch.export.ExportedProgram) -> dict[str, tuple[int, int | None]]:
    """The program's symbolic dimensions: symbol name -> (lowest, highest or None)."""
    from torch.utils._sympy.numbers import int_oo

    found: dict[str, tuple[int, int | None]] = {}
    for symbol, bounds in program.range_constraints.items():
        upper = None if bounds.upper in (int_oo, float("inf")) else int(bounds.upper)
        found[str(symbol)] = (int(bounds.lower), upper)
    return found


def static_batches(program: torch.export.ExportedProgram) -> list[str]:
    """User inputs of two or more dimensions whose first dimension the capture left static."""
    user = set(program.graph_signature.user_inputs)
    found = []
    for node in program.graph.nodes:
        value = node.meta.get("val")
        if node.op != "placeholder" or node.name not in user:
            continue
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and is_static(value.shape[0]):
            found.append(f"{node.name} (size {int(value.shape[0])})")
    return found
