"""Calibration for PyTorch models: the float32 range of every value, recorded by running the
captured GraphModule in an FX interpreter, keyed by the names the FX reader gives the values
(so the ``range`` pass finds them in the OpGraph).

Each value is reduced to its three statistics as soon as it is made (the interpreter frees it
when its last reader has run), so memory stays that of one forward pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import fx

from graphamp.errors import GraphampError
from graphamp.fx.reader import stable_names
from graphamp.ranges import Ranges, TensorRange


class _Recorder(fx.Interpreter):
    """Runs the module, keeping each float32 value's range under its reader name."""

    def __init__(self, module: fx.GraphModule, names: dict[str, str]) -> None:
        super().__init__(module)
        self.names = names
        self.found: dict[str, TensorRange] = {}

    def run_node(self, node: fx.Node) -> Any:
        result = super().run_node(node)
        if node.op in ("placeholder", "call_function") and node.name in self.names:
            name = self.names[node.name]
            if isinstance(result, tuple | list):
                for index, value in enumerate(result):
                    self._record(f"{name}.{index}", value)
            else:
                self._record(name, result)
        return result

    def _record(self, name: str, value: object) -> None:
        if isinstance(value, torch.Tensor) and value.dtype == torch.float32 and value.numel():
            self.found[name] = tensor_range(value.detach())


def tensor_range(value: torch.Tensor) -> TensorRange:
    magnitude = value.abs()
    finite = torch.isfinite(magnitude)
    finite_values = magnitude[finite]
    nonzero = finite_values[finite_values > 0]
    return TensorRange(
        max_abs=float(finite_values.max()) if finite_values.numel() else 0.0,
        min_abs=float(nonzero.min()) if nonzero.numel() else None,
        nonfinite=int((~finite).sum()),
    )


def calibrate(module: fx.GraphModule, batches: Iterable[Any], *, label: str = "") -> Ranges:
    """The ranges of ``module``'s float32 values over ``batches``: each batch the module's
    positional arguments (a tuple or list), one tensor or array, or a dict of arrays by input
    name (what ``--inputs DATA`` files hold)."""
    names = stable_names(module)
    inputs = [n.name for n in module.graph.nodes if n.op == "placeholder"]
    ranges = Ranges(model=label)
    with torch.no_grad():
        for index, batch in enumerate(batches):
            recorder = _Recorder(module, names)
            recorder.run(*_arguments(batch, inputs, index))
            ranges.update(Ranges(recorder.found, batches=1))
    if not ranges.batches:
        raise GraphampError("calibrate: no batches")
    return ranges


def _arguments(batch: Any, inputs: list[str], index: int) -> list[torch.Tensor]:
    if isinstance(batch, Mapping):
        missing = [name for name in inputs if name not in batch]
        if missing:
            raise GraphampError(f"calibrate: batch {index} has no value for input {missing[0]!r}")
        batch = [batch[name] for name in inputs]
    elif not isinstance(batch, tuple | list):
        batch = [batch]
    if len(batch) != len(inputs):
        raise GraphampError(
            f"calibrate: batch {index} holds {len(batch)} values, the module takes {len(inputs)}"
        )
    return [torch.as_tensor(np.asarray(v)) if not isinstance(v, torch.Tensor) else v for v in batch]
