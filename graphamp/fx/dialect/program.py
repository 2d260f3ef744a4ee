"""A converted module exported again as a torch.export program, and written as a ``.pt2``
archive with its plan: what :func:`graphamp.fx.save` and ``graphamp convert model.pt2`` both
write, so they write the same program for the same model and policy.

:func:`export` exports the converted GraphModule with torch.export (its casts are aten ops like
any other, its parameters in the types the conversion chose) on inputs of the traced shapes,
each symbolic dimension as it was captured (a named dimension with its range, shared where the
capture shared it). :func:`write` stores it with ``torch.export.save``, the plan in the archive
(``extra/graphamp/plan.json``) and no sample inputs, so nothing in the archive is a pickle.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import fx

from graphamp.core.io import staged
from graphamp.errors import GraphampError
from graphamp.fx.dialect.capture import Captured, is_static
from graphamp.fx.dialect.samples import sample_values
from graphamp.plans.plan import Plan

PLAN_FILE = "graphamp/plan.json"


def check_target(path: Path) -> None:
    """Refuse, before any work, a path a program cannot be written to."""
    if path.is_dir():
        raise GraphampError(f"{path}: is a folder; a program needs a file name")
    if not path.parent.is_dir():
        raise GraphampError(f"{path}: folder {path.parent} does not exist")
    if path.suffix != ".pt2":
        raise GraphampError(f"{path}: a torch.export program is a .pt2 file")


def write(program: torch.export.ExportedProgram, path: Path, plan: Plan | None) -> None:
    """``torch.export.save`` of ``program`` with ``plan`` in the archive, written beside
    ``path`` under its name (the archive's folder is named after the file) and moved into
    place when complete."""
    extra = {PLAN_FILE: plan.to_json()} if plan is not None else {}
    program.example_inputs = None  # torch would store them as a pickle
    for module in program.graph_module.modules():
        for node in getattr(module, "graph", fx.Graph()).nodes:
            # provenance naming Python object ids: the file would differ from run to run
            node.meta.pop("from_node", None)
    with staged(path) as staging:
        torch.export.save(program, str(staging), extra_files=extra)


def export(module: fx.GraphModule) -> torch.export.ExportedProgram:
    """``module`` (a converted capture) exported again, with its symbolic dimensions."""
    captured = captured_by(module)
    _rename_lifted_constants(module)
    placeholders = [node for node in module.graph.nodes if node.op == "placeholder"]
    # values of the traced shapes, the same however the module was captured: the program
    # exported does not depend on the example's values
    inputs = sample_values(module.graph, placeholders)
    args, kwargs = torch.utils._pytree.tree_unflatten(inputs, module._in_spec)
    shapes = torch.export.ShapesCollection()
    dims: dict[str, Any] = {}
    for node, value in zip(placeholders, inputs, strict=True):
        traced = node.meta.get("val")
        if isinstance(value, torch.Tensor) and isinstance(traced, torch.Tensor):
            # a traced shape holds a SymInt where the capture left a dimension symbolic (the
            # stubs say int)
            sizes: tuple[int | torch.SymInt, ...] = tuple(traced.shape)
            spec = {
                index: _dim(size, captured.ranges, dims)
                for index, size in enumerate(sizes)
                if isinstance(size, torch.SymInt) and not is_static(size)
            }
            if spec:
                shapes[value] = spec
    try:
        program = torch.export.export(
            module, args, kwargs, dynamic_shapes=shapes.dynamic_shapes(module, args, kwargs)
        )
    except Exception as exc:
        raise GraphampError(f"the converted module could not be exported again: {exc}") from None
    for node in program.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:  # each export prefixes the keys once more: as the first export named them
            node.meta["nn_module_stack"] = {
                _REPEATED_SELF.sub("L__self__", key): value for key, value in stack.items()
            }
    return program


_REPEATED_SELF = re.compile(r"^(L__self__)+")
_LIFTED = re.compile(r"^lifted_tensor_\d+$")


def _rename_lifted_constants(module: fx.GraphModule) -> None:
    """Rename the tensor constants the first export lifted (``lifted_tensor_0``,
    ``layers.0.self_attn.lifted_tensor_2``): exporting again lifts the nested ones under fresh
    root names ``lifted_tensor_0``, ... that collide with the root's own, and the program
    written then names one constant twice (neither reader can load it: Mistral's masks). The
    module computes the same."""
    for node in module.graph.nodes:
        if node.op != "get_attr" or not _LIFTED.match(node.target.rpartition(".")[2]):
            continue
        owner_path, _, name = node.target.rpartition(".")
        owner = module.get_submodule(owner_path)
        value = getattr(owner, name)
        if (
            not isinstance(value, torch.Tensor)
            or name in owner._buffers
            or name in owner._parameters
        ):
            continue
        number = int(name.removeprefix("lifted_tensor_"))
        while hasattr(owner, f"graphamp_constant_{number}"):  # a loaded program's own
            number += 1
        new_name = f"graphamp_constant_{number}"
        setattr(owner, new_name, value)
        delattr(owner, name)
        node.target = f"{owner_path}.{new_name}" if owner_path else new_name
    module.recompile()


def captured_by(module: object) -> Captured:
    captured = getattr(module, "meta", {}).get("graphamp")
    if not isinstance(module, fx.GraphModule) or not isinstance(captured, Captured):
        raise GraphampError(
            f"expected a module graphamp.fx.convert returned, got {type(module).__name__}"
        )
    return captured


def _dim(size: torch.SymInt, ranges: dict[str, tuple[int, int | None]], dims: dict) -> Any:
    """A named dimension with the captured range for a plain symbol (one object per symbol,
    so inputs that shared it share it again), ``Dim.AUTO`` for an expression of symbols."""
    from torch.export import Dim

    name = str(size.node.expr)
    if name not in ranges:
        return Dim.AUTO
    if name not in dims:
        lowest, highest = ranges[name]
        dims[name] = Dim(name, min=lowest, max=highest) if highest else Dim(name, min=lowest)
    return dims[name]
