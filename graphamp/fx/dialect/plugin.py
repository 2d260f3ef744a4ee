"""The FX dialect: PyTorch modules, GraphModules and ExportedPrograms in memory."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import fx, nn

from graphamp.dialects.base import Dialect, ReadGraph
from graphamp.errors import GraphampError, RunFailure
from graphamp.fx.dialect import reader, writer
from graphamp.fx.dialect.capture import capture, example_args
from graphamp.fx.dialect.samples import embedding_bounds, input_spec
from graphamp.fx.dialect.types import torch_dtype
from graphamp.lists import matrix_ops
from graphamp.numerics.inputs import InputSpec
from graphamp.numerics.ranges import Ranges
from graphamp.plans.edits import EditScript
from graphamp.policy.policy import Policy

WEIGHT_MODES = ("master", "low")
NO_GPU = "--provider cuda: PyTorch sees no GPU here: verify with --provider cpu"


class TorchDialect(Dialect):
    """What the PyTorch dialects share, whatever model object they hold (a GraphModule for
    :class:`FxDialect`, an ExportedProgram for ``.pt2`` files): ``weights="master"`` keeps
    float32 parameters and casts each once per call where it is used in low precision
    (training: gradients arrive in float32); ``weights="low"`` stores parameters read only in
    low precision in the target type (inference: half the memory)."""

    lists = "fx_cpu"
    matrix_ops = matrix_ops("aten")
    float8_weights = "traced"  # fx/float8_convert finds the parameter behind casts, transposes
    default_dtype = "bfloat16"

    def __init__(
        self,
        *,
        weights: str = "master",
        example_inputs: tuple[Any, ...] | torch.Tensor | None = None,
        example_kwargs: dict[str, Any] | None = None,
        dynamic_shapes: Any = None,
    ) -> None:
        if weights not in WEIGHT_MODES:
            raise GraphampError(f"weights={weights!r}: choose 'master' or 'low'")
        self.weights = weights
        self.example_inputs = example_args(example_inputs)
        self.example_kwargs = example_kwargs
        self.dynamic_shapes = dynamic_shapes

    def accepts(self, source: object) -> bool:
        return isinstance(source, nn.Module | torch.export.ExportedProgram)

    def check_provider(self, provider: str) -> None:
        if provider == "cuda" and not torch.cuda.is_available():
            raise GraphampError(NO_GPU)

    def calibrate(self, model: Any, batches: Iterable[Any], *, histograms: bool = False) -> Ranges:
        from graphamp.fx.dialect.calibration import calibrate

        module = model if isinstance(model, fx.GraphModule) else self.load(model)
        if not isinstance(module, fx.GraphModule):  # a .pt2 program
            module = capture(module, None)
        return calibrate(module, batches, label=self.label(model), histograms=histograms)

    def label(self, source: object) -> str:
        return type(source).__name__


class FxDialect(TorchDialect):
    """PyTorch modules, GraphModules and ExportedPrograms in memory, converted as a captured
    GraphModule (see :class:`TorchDialect` for ``weights``)."""

    name = "fx"

    def load(self, source: object) -> fx.GraphModule:
        return capture(
            source,
            self.example_inputs,
            self.example_kwargs,
            self.dynamic_shapes,
        )

    def read(self, model: fx.GraphModule, policy: Policy) -> ReadGraph:
        return reader.read(model, master_weights=self.weights == "master")

    def apply(self, read: ReadGraph, script: EditScript) -> fx.GraphModule:
        return writer.apply(read, script)

    def save(self, model: Any, path: Any) -> None:
        """A converted module as a ``.pt2`` program with its plan
        (:mod:`graphamp.fx.dialect.program`)."""
        from graphamp.fx.dialect.program import captured_by, check_target, export, write

        check_target(Path(path))
        write(export(model), Path(path), captured_by(model).plan)

    def keep_plan(self, model: fx.GraphModule, plan: Any) -> None:
        captured = model.meta.get("graphamp")
        if captured is not None:  # a capture's (graphamp.fx.save exports it with its plan)
            captured.plan = plan

    def input_specs(self, model: fx.GraphModule) -> list[InputSpec]:
        placeholders = [n for n in model.graph.nodes if n.op == "placeholder"]
        return [input_spec(node, embedding_bounds(model.graph)) for node in placeholders]

    def run(
        self, model: Any, feeds: dict[str, np.ndarray], *, provider: str = "cpu"
    ) -> tuple[dict[str, np.ndarray], str]:
        names = [n.name for n in model.graph.nodes if n.op == "placeholder"]
        return run_module(model, names, self.input_specs(model), feeds, provider)


def run_module(
    module: Any,
    names: list[str],
    specs: list[InputSpec],
    feeds: dict[str, np.ndarray],
    provider: str,
) -> tuple[dict[str, np.ndarray], str]:
    """Call ``module`` on ``feeds`` (by input name, converted to the traced types) and return
    its float outputs as float32 arrays named ``output <i>``."""
    device = "cuda" if provider == "cuda" else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise GraphampError(NO_GPU)
    args = []
    for name, spec in zip(names, specs, strict=True):
        if name not in feeds:
            raise GraphampError(f"no value given for model input {name!r}")
        array = np.asarray(feeds[name])
        if spec.shape and tuple(array.shape) != tuple(d for d in spec.shape):
            raise GraphampError(
                f"input {name!r}: shape {tuple(array.shape)}, the program was traced with "
                f"{tuple(spec.shape)}"
            )
        args.append(torch.from_numpy(array).to(device=device, dtype=torch_dtype(spec.dtype)))
    with torch.no_grad():
        try:
            result = module(*args)
        except RuntimeError as exc:  # a shape or value the module does not take
            message = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise RunFailure(f"torch: {message}") from None
    flat = result if isinstance(result, tuple | list) else (result,)
    outputs = {f"output {i}": t.float().cpu().numpy() for i, t in enumerate(flat)}
    return outputs, f"torch ({device})"
