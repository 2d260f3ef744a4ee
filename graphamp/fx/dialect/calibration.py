"""Calibration for PyTorch models: the float32 range of every value, recorded by running the
captured GraphModule in an FX interpreter, keyed by the names the FX reader gives the values
(so the ``range`` pass finds them in the OpGraph).

Each value is reduced to its three statistics as soon as it is made (the interpreter frees it
when its last reader has run), so memory stays that of one forward pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import fx

from graphamp.errors import GraphampError
from graphamp.fx.dialect import hops
from graphamp.fx.dialect.capture import first_line
from graphamp.fx.dialect.ops import flat, matrix_dims, op_name
from graphamp.fx.dialect.reader import stable_names
from graphamp.numerics.ranges import Ranges, TensorRange, log2_counts


class _Recorder(fx.Interpreter):
    """Runs the module, keeping each float32 value's range under its reader name. A
    ``torch.cond``, ``while_loop`` or ``map`` call runs its bodies in recorders of their own,
    so values inside are recorded under their scope paths too (over every iteration)."""

    def __init__(
        self,
        module: fx.GraphModule,
        names: dict[str, str],
        found: dict[str, TensorRange] | None = None,
        counted: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(module)
        self.graph_module = module  # (``module`` as Interpreter types it: an nn.Module)
        self.names, self.counted = names, counted
        self.found: dict[str, TensorRange] = {} if found is None else found

    def run_node(self, node: fx.Node) -> Any:
        call = hops.call_of(self.graph_module, node)
        if call is None:
            result = super().run_node(node)
        else:
            args, _ = self.fetch_args_kwargs_from_env(node)
            result = self._call(call, self.names.get(node.name, node.name), args)
        if node.op in ("placeholder", "call_function") and node.name in self.names:
            name = self.names[node.name]
            if isinstance(result, tuple | list):
                for index, value in enumerate(result):
                    self._record(f"{name}.{index}", value)
            else:
                self._record(name, result)
        return result

    def _call(self, call: hops.HopCall, name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """What ``call`` returns, its bodies run by recorders (the reader's names)."""
        bodies = dict(call.bodies)

        def run(attribute_name: str, *values: Any) -> tuple[Any, ...]:
            module, path = bodies[attribute_name], f"{name}/{attribute_name}"
            names = stable_names(module, path)
            # a parameter under its path, as the reader names a loop's carried value or slice
            names.update({p.name: f"{path}/{p.name}" for p in hops.placeholders(module)})
            recorder = _Recorder(module, names, self.found)
            result = recorder.run(*values)
            return tuple(result) if isinstance(result, tuple | list) else (result,)

        target = call.node.target
        if target is hops.COND:
            branch = call.results[0] if bool(args[0]) else call.results[1]
            return run(branch, *args[3])
        if target is hops.WHILE_LOOP:
            carried, additional = tuple(args[2]), tuple(args[3])
            condition, body = (attribute_name for attribute_name, _ in call.bodies)
            while bool(run(condition, *carried, *additional)[0]):
                carried = run(body, *carried, *additional)
            return carried
        xs, rest = list(args[1]), list(args[2])
        slices = [run(call.results[0], *(x[i] for x in xs), *rest) for i in range(len(xs[0]))]
        return tuple(torch.stack(list(outputs)) for outputs in zip(*slices, strict=True))

    def _record(self, name: str, value: object) -> None:
        if isinstance(value, torch.Tensor) and value.dtype == torch.float32 and value.numel():
            found = tensor_range(value.detach())
            if name in self.counted:
                found = dataclasses.replace(found, log2_counts=log2_counts(value.detach().numpy()))
            known = self.found.get(name)
            self.found[name] = found if known is None else known.merged(found)


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


def calibrate(
    module: fx.GraphModule, batches: Iterable[Any], *, label: str = "", histograms: bool = False
) -> Ranges:
    """The ranges of ``module``'s float32 values over ``batches``: each batch the module's
    positional arguments (a tuple or list), one tensor or array, or a dict of arrays by input
    name (what ``--inputs DATA`` files hold). With ``histograms``, the values a matrix op
    multiplies also get their binade histograms (float8's ``fp8_range`` rule)."""
    names = stable_names(module)
    inputs = [n.name for n in module.graph.nodes if n.op == "placeholder"]
    counted = frozenset(_matrix_operands(module, names)) if histograms else frozenset()
    ranges = Ranges(model=label)
    with torch.no_grad():
        for index, batch in enumerate(batches):
            recorder = _Recorder(module, names, counted=counted)
            arguments = _arguments(batch, inputs, index)
            try:
                recorder.run(*arguments)
            except AssertionError as exc:  # the capture's guards: a size it fixed differs
                pairs = zip(inputs, arguments, strict=True)
                shapes = ", ".join(f"{name} {list(value.shape)}" for name, value in pairs)
                raise GraphampError(
                    f"calibrate: batch {index} ({shapes}) does not fit the captured module: "
                    f"{first_line(exc)} (the capture fixed that size: give calibration "
                    "batches of the example's shapes there, or pass dynamic_shapes)"
                ) from None
            ranges.update(Ranges(recorder.found, batches=1))
    if not ranges.batches:
        raise GraphampError("calibrate: no batches")
    return ranges


def _matrix_operands(module: fx.GraphModule, names: dict[str, str]) -> list[str]:
    """The names of the values the main graph's matrix ops read (their A and B slots)."""
    found = []
    for node in module.graph.nodes:
        dims = matrix_dims(node, op_name(node)) if node.op == "call_function" else None
        if dims is None:
            continue
        args = [a for a in flat([node.args, node.kwargs]) if isinstance(a, fx.Node)]
        found += [names.get(args[s].name, args[s].name) for s in (dims.a, dims.b)]
    return found


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
