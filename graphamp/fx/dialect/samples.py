"""What a captured graph was traced with: the shapes and types of its inputs, and random
values of them (for verification, and to export a converted module again)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import fx

from graphamp.errors import GraphampError
from graphamp.fx.dialect.types import dtype_name, torch_dtype
from graphamp.numerics.inputs import InputSpec, random_inputs


def input_spec(node: fx.Node, bounds: dict[str, int]) -> InputSpec:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        raise GraphampError(f"input {node.name!r} of the program is not a tensor")
    return InputSpec(node.name, dtype_name(value.dtype), traced_shape(value), bounds.get(node.name))


def traced_shape(value: torch.Tensor) -> tuple[int, ...]:
    """The shape ``value`` was traced with: a symbolic dimension's example size (its hint),
    read without the guard ``int()`` would add (which would fix the dimension)."""
    return tuple(d if isinstance(d, int) else int(d.node.hint) for d in value.shape)


def sample_values(graph: fx.Graph, nodes: list[fx.Node], seed: int = 0) -> list[Any]:
    """Random values of the traced shapes and types for the placeholders ``nodes`` of
    ``graph`` (never zeros; token ids inside their embedding table); a placeholder that is not
    a tensor keeps its traced value."""
    bounds = embedding_bounds(graph)
    specs = [input_spec(n, bounds) for n in nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    feeds = random_inputs(specs, seed=seed)
    values = {
        spec.name: torch.from_numpy(np.asarray(feeds[spec.name])).to(torch_dtype(spec.dtype))
        for spec in specs
    }
    return [values[n.name] if n.name in values else n.meta.get("val") for n in nodes]


def embedding_bounds(graph: fx.Graph) -> dict[str, int]:
    """Integer inputs that index an embedding table: the table's rows (token ids stay in it)."""
    bounds: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_function" and getattr(node.target, "_opname", "") == "embedding":
            table, indices = node.args[0], node.args[1]
            rows = int(table.meta["val"].shape[0])
            bounds[indices.name] = min(rows, bounds.get(indices.name, rows))
    return bounds
