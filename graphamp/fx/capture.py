"""Capturing a PyTorch model as a torch.fx graph in torch.export's training IR.

Its op names (``linear``, ``matmul``, ``layer_norm``, ...) are the ones PyTorch's autocast
lists name, and its nodes carry their module path (``nn_module_stack``), which name rules match.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from graphamp.errors import GraphampError


def capture(
    model: nn.Module | torch.export.ExportedProgram, example_inputs: tuple[Any, ...] | None
) -> fx.GraphModule:
    """A fresh GraphModule in torch.export's training IR; ``model`` is not changed."""
    if isinstance(model, torch.export.ExportedProgram):
        program = model
    elif isinstance(model, nn.Module):
        if example_inputs is None:
            raise GraphampError(
                f"{type(model).__name__}: example_inputs are needed to capture "
                "the module with torch.export"
            )
        try:
            program = torch.export.export(model, tuple(example_inputs))
        except Exception as exc:  # torch.export raises many types; the first line names it
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise GraphampError(
                f"{type(model).__name__}: torch.export could not capture it: {first[:300]}"
            ) from None
    else:
        raise GraphampError(
            f"expected an nn.Module, GraphModule or ExportedProgram, got {type(model).__name__}"
        )
    return program.module()
