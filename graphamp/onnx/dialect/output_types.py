"""Every graph output of a converted model declared as the checker requires: a type and a shape.

``onnx.checker`` refuses a main-graph output whose tensor type lacks an element type or a
``shape`` (onnxruntime runs such a model; the checker, and tools built on it, do not). The
readers give each output what type inference settles, and the writers write what the
conversion made of it; an output inference left without a shape is settled here, after
the writer, on the model about to be saved:

1. An If's output whose branches return different ranks (onnxconverter-common's If test
   model: rank 1 from ``then_branch``, a scalar from ``else_branch``) has no declaration that
   fits both: it is declared with the larger rank, every size unknown, which the checker
   accepts and onnxruntime runs (warning when a run returns the other rank), and a
   :class:`~graphamp.errors.RepairWarning` names it.
2. Any other output whose shape or element type nothing tells (a custom op's, declared with
   no type) is refused, naming it: no declaration can be made up for it, and no valid model
   can be written without one.
"""

from __future__ import annotations

import warnings
from typing import Any

import onnx

from graphamp.errors import GraphampError, RepairWarning


def declare_outputs(model: Any) -> None:
    """Settle the outputs of ``model`` (a ModelProto or a streamed model, whose ``proto``
    holds its graph) that lack a type or shape (module docstring), in place."""
    proto: onnx.ModelProto = getattr(model, "proto", model)
    _declare_proto(proto.graph)


def _declare_proto(graph: onnx.GraphProto) -> None:
    producers = None
    for output in graph.output:
        tensor = output.type.tensor_type
        kind = output.type.WhichOneof("value")
        if kind not in (None, "tensor_type") or (tensor.elem_type and tensor.HasField("shape")):
            continue
        if producers is None:
            producers = {name: node for node in graph.node for name in node.output}
        name = output.name
        node = producers.get(name)
        while node is not None and node.op_type == "Cast":  # an output cast back to its type
            name = node.input[0]
            node = producers.get(name)
        ranks: dict[str, int | None] = {}
        types: list[int] = [tensor.elem_type]
        if node is not None and node.op_type == "If" and node.domain in ("", "ai.onnx"):
            index = list(node.output).index(name)
            bodies = {attribute.name: attribute.g for attribute in node.attribute}
            for branch in _BRANCHES:  # in this order, whatever the node's attributes' order
                body = bodies.get(branch)
                if body is not None and index < len(body.output):
                    result = body.output[index].type.tensor_type
                    ranks[branch] = len(result.shape.dim) if result.HasField("shape") else None
                    types.append(result.elem_type)
        rank, elem_type = _settled(output.name, ranks, types)
        tensor.elem_type = elem_type
        tensor.shape.Clear()
        for _ in range(rank):
            tensor.shape.dim.add()


_BRANCHES = ("then_branch", "else_branch")


def _settled(name: str, ranks: dict[str, int | None], types: list[int]) -> tuple[int, int]:
    """(rank, element type) to declare output ``name`` with, from its If's branches' results;
    refused where they do not tell (module docstring)."""
    elem_type = next((t for t in types if t), 0)
    if len(ranks) < 2 or None in ranks.values() or not elem_type:
        raise GraphampError(
            f"graph output {name!r} declares no shape and type inference cannot settle one:"
            " the ONNX checker refuses a graph output without one, so no valid model can be"
            " written; declare its type and shape in the model"
        )
    rank = max(r for r in ranks.values() if r is not None)
    if len(set(ranks.values())) > 1:
        shown = " and ".join(f"rank {r} from {branch}" for branch, r in ranks.items())
        warnings.warn(
            f"graph output {name!r} declares no shape and its If returns {shown}: declared"
            f" rank {rank} of unknown sizes (the checker requires a shape; onnxruntime warns"
            " when a run returns another rank)",
            RepairWarning,
            stacklevel=4,
        )
    return rank, elem_type
