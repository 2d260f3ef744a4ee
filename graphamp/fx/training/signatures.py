"""A training step's graphs, one set per batch signature.

``make_fx`` records the shapes it traced with: a view to the captured batch's size, the
``expand`` of a sum's gradient, a size read in the loss (``x.shape[0]``) as a constant. A step
graph captured on batches of 32 failed on the last batch of an epoch that holds 20, with a
shape error from deep inside the graph. So the step keys its graphs by what the trace
specialised on (each batch tensor's shape, type, device and whether it is contiguous) and
captures anew, from the same parameters and state, on a signature it has not seen, as
``torch.compile`` recompiles on a new shape.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from graphamp.core.graph import OpGraph
from graphamp.errors import GraphampError, InternalError, RecaptureWarning
from graphamp.fx.training import differentiate, eager, partition
from graphamp.plans.records import NodeDecision, ScaleRecord

# Past this many signatures a step warns once: each capture takes seconds and holds its own
# graphs; batches padded to a few lengths keep it to a few (torch.compile's limit is 8 too).
MANY_SIGNATURES = 8


# Per batch item: a tensor's (shape, dtype, device, contiguous), another value's (type name, repr).
BatchSignature = tuple[tuple[Hashable, ...], ...]


def batch_signature(batch: Sequence[Any]) -> BatchSignature:
    """What a captured step graph specialised on, per batch item."""
    return tuple(
        (tuple(item.shape), item.dtype, item.device, item.is_contiguous())
        if isinstance(item, torch.Tensor)
        else (type(item).__name__, repr(item))
        for item in batch
    )


def refuse_nested_tensors(batch: Sequence[Any]) -> None:
    """A batch item that is a tuple, list or dict holding tensors, in one line: the step takes
    each model input and the target as a tensor (other values are constants it specialises
    on), and the capture failed inside ('forward() takes 11 positional arguments')."""
    for index, item in enumerate(batch):
        if isinstance(item, tuple | list | dict) and any(
            isinstance(leaf, torch.Tensor) for leaf in torch.utils._pytree.tree_leaves(item)
        ):
            what = "the target" if index == len(batch) - 1 else f"model input {index}"
            raise GraphampError(
                f"step(*batch): {what} is a {type(item).__name__} holding tensors; the step "
                "takes each model input and the target as one tensor: wrap the model (or the "
                "loss) in a module or function that takes tensors"
            )


def describe(signature: BatchSignature) -> str:
    """``signature`` as a user reads it: ``float32[20, 8], int64[20]``."""
    parts = []
    for item in signature:
        shape, kind = item[0], item[1]
        if isinstance(kind, torch.dtype) and isinstance(shape, tuple):
            dtype = str(kind).removeprefix("torch.")
            parts.append(f"{dtype}[{', '.join(str(size) for size in shape)}]")
        else:  # (type name, repr) of a value that is not a tensor
            text = str(kind)
            parts.append(text if len(text) <= 40 else f"{shape} {text[:37]}...")
    return ", ".join(parts)


@dataclass
class CapturedStep:
    """One traced step graph and what the training passes added to it."""

    module: fx.GraphModule
    graph: OpGraph  # the neutral view, after the passes
    state_inputs: list[str]  # state placeholders, after the traced arguments
    state_outputs: list[tuple[str, str]]  # (output, the state it replaces), after the others
    decisions: dict[str, NodeDecision]
    scales: list[ScaleRecord] = field(default_factory=list)  # float8 values it quantises


@dataclass
class StepGraphs:
    """The graphs captured for one batch signature: what each capture added (``"update"``,
    and ``"accumulate"`` with ``accumulate > 1``) and the callables that run them (compiled
    or not)."""

    captured: dict[str, CapturedStep]
    update: Callable[..., Any]
    accumulate: Callable[..., Any] | None


def compiled(graphs: StepGraphs, options: dict[str, Any], write_back: bool) -> StepGraphs:
    """``graphs`` under ``torch.compile(**options)``, handed their functional form
    (:func:`graphamp.fx.training.eager.for_compile`); with ``write_back``, each new state written
    into the argument it replaces (:func:`written_back`). A graph whose forward normalises
    with batch statistics is compiled as two, its forward and the rest, where it can be cut
    (:mod:`graphamp.fx.training.partition`, :func:`~graphamp.fx.training.partition.cut_pays`)."""

    def one(key: str) -> Callable[..., Any]:
        # the captured GraphModule: what the step runs until it is compiled
        captured = graphs.captured[key]
        pairs = written_back(captured) if write_back else []
        eager.for_compile(captured.module, pairs)
        if partition.uses_inductor(options):
            partition.max_pool_offsets(captured.module)
            partition.random_masks(captured.module)
        # forward and the rest as two graphs, as torch.compile's own training path has them,
        # where that runs faster
        parts = partition.split(captured.module) if partition.cut_pays(captured.module) else None
        if parts is None:
            return differentiate.compiled(captured.module, options)
        return partition.compiled(parts, options, differentiate.compiled)

    update = one("update")
    accumulate = one("accumulate") if "accumulate" in graphs.captured else None
    return StepGraphs(graphs.captured, update, accumulate)


def written_back(captured: CapturedStep) -> list[tuple[int, str]]:
    """(output index, placeholder name) of each state ``captured``'s graph returns anew and
    the argument it replaces: after the loss, the state the step holds (parameters, optimizer
    state, carried gradients: its first arguments, in order), then the state the passes added
    (the last outputs and arguments, paired by name)."""
    names = [n.name for n in captured.module.graph.nodes if n.op == "placeholder"]
    output = next(n for n in captured.module.graph.nodes if n.op == "output")
    held = len(output.args[0]) - 1 - len(captured.state_outputs)
    pairs = [(1 + index, names[index]) for index in range(held)]
    first_state = len(names) - len(captured.state_inputs)
    for offset, (_, replaces) in enumerate(captured.state_outputs):
        if replaces in captured.state_inputs:
            position = first_state + captured.state_inputs.index(replaces)
            pairs.append((1 + held + offset, names[position]))
    return pairs


def warn_if_many(count: int, latest: BatchSignature) -> None:
    """Warn once, when the step has just captured its ``MANY_SIGNATURES``-th signature."""
    if count == MANY_SIGNATURES:
        warnings.warn(
            f"the training step has now been captured for {count} batch signatures (the "
            f"latest: {describe(latest)}); each capture takes time and memory: pad batches "
            "to a few fixed shapes",
            RecaptureWarning,
            stacklevel=4,
        )


@contextmanager
def capturing(signature: BatchSignature, first: bool) -> Iterator[None]:
    """Errors from tracing the model and the loss on a batch (a batch the model cannot take,
    a loss that reads values on the host) as one line that names the batch. On the first
    capture graphamp's own errors pass as they are: they may be about the options."""
    try:
        yield
    except InternalError:
        raise
    except Exception as error:
        if first and isinstance(error, GraphampError):
            raise
        lines = str(error).strip().splitlines() or [""]
        own = isinstance(error, GraphampError)
        cause = lines[0] if own else f"{type(error).__name__}: {lines[0]}"
        if type(error).__name__ == "DynamicOutputShapeException":
            cause += (
                " (an op whose output's shape depends on the values, such as boolean indexing"
                " or one-argument torch.where routing tokens to experts: the step is one static"
                " graph, so write it with fixed shapes, a mask multiplied in or a fixed capacity)"
            )
        raise GraphampError(
            f"step(*batch): capturing the step on a batch of {describe(signature)} failed: {cause}"
        ) from error
