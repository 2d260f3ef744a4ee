"""The Dialect interface: everything graphamp needs from one kind of model.

A dialect loads its models, reads one into the neutral :class:`~graphamp.core.graph.OpGraph`
(per-slot rules from its own schema source), applies an :class:`~graphamp.plans.edits.EditScript`
back to it, saves it, and runs it for verification. The engine, the CLI, verification and plans
go through this interface only; :mod:`graphamp.dialects.registry` finds the dialect for a file
or an object. See docs/ARCHITECTURE.md for a worked example (a toy JSON graph dialect).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from graphamp.core.graph import OpGraph
from graphamp.errors import GraphampError
from graphamp.numerics.inputs import InputSpec
from graphamp.numerics.ranges import Ranges
from graphamp.plans.edits import EditScript
from graphamp.policy.policy import Policy


@dataclass
class ReadGraph:
    """What :meth:`Dialect.read` gives: the neutral graph, and the dialect's model with whatever
    the dialect needs to map the graph's names back to its own objects (``handles``)."""

    graph: OpGraph
    model: Any
    handles: Any = None


class Dialect(abc.ABC):
    """One model format (see the module docstring). Instances may carry options (the FX
    dialect's weight storage, say); the class attributes describe the format."""

    name: ClassVar[str]
    lists: ClassVar[str]  # the op-list family its policies use ("onnx", "fx_cpu", ...)
    default_dtype: ClassVar[str] = "float16"
    # Used when the class is registered directly (built-ins are declared in the registry):
    suffixes: ClassVar[tuple[str, ...]] = ()  # file names it reads, e.g. (".onnx",)
    object_modules: ClassVar[tuple[str, ...]] = ()  # top-level packages of objects it takes
    matrix_ops: ClassVar[frozenset[str]] = frozenset()  # op types counted as matrix work
    # Which weight a static float8 product quantises at conversion: "stored", the stored value
    # the product reads itself (ONNX: an initializer; a weight computed from one at run time,
    # an unfolded Transpose, cannot be); "traced", the parameter behind the casts and
    # transposes the product reads it through (FX).
    float8_weights: ClassVar[str] = "stored"

    def accepts(self, source: object) -> bool:
        """Whether an in-memory object is a model of this dialect (checked after the
        registry matched the object's package)."""
        return True

    @abc.abstractmethod
    def load(self, source: str | Path | object) -> Any:
        """The dialect's model from a file path or an object; the source is never changed."""

    @abc.abstractmethod
    def read(self, model: Any, policy: Policy) -> ReadGraph:
        """The OpGraph of ``model`` for conversion under ``policy``."""

    @abc.abstractmethod
    def apply(self, read: ReadGraph, script: EditScript) -> Any:
        """Apply ``script`` to the model behind ``read``; returns the converted model."""

    @abc.abstractmethod
    def save(self, model: Any, path: Path) -> None:
        """Write ``model`` to ``path`` atomically (nothing is left on error)."""

    def keep_plan(self, model: Any, plan: Any) -> None:  # noqa: B027 (optional)
        """Keep ``plan`` with the converted ``model``, for a format that stores it (a ``.pt2``
        archive holds it beside the program). Default: nothing."""

    def save_unchanged(self, source: Path, path: Path) -> bool:
        """When a conversion changed nothing: write the file ``source`` to ``path`` byte for
        byte and say True, where the dialect would write it as it is; False leaves the
        writing to :meth:`save`. Default: False."""
        return False

    def check_runtime(self, original: Path, converted: Path) -> list[str]:
        """Before a converted file is put in place: raise :class:`InternalError` when the
        runtime refuses the converted model but accepts the original (graphamp produced
        something invalid); return warnings worth a line (a provider with no kernel for the
        low type, say). Default: nothing to check."""
        return []

    def files(self, path: Path) -> list[Path]:
        """The files the model at ``path`` consists of, ``path`` first (an ONNX model's
        external data files): what a command must never write over."""
        return [Path(path)]

    def written_files(self, path: Path) -> list[Path]:
        """The files :meth:`save` may write for ``path``, ``path`` first."""
        return [Path(path)]

    def check_target(self, path: Path) -> None:  # noqa: B027 (optional: most accept any path)
        """Refuse, before any work, an output path this dialect cannot write."""

    def check_provider(self, provider: str) -> None:  # noqa: B027 (optional: cpu runs anywhere)
        """Refuse, before any work, a provider :meth:`run` cannot use on this machine."""

    @abc.abstractmethod
    def input_specs(self, model: Any) -> list[InputSpec]:
        """The graph inputs a caller feeds, for :func:`graphamp.numerics.inputs.random_inputs`
        (``model``: a model, or the path of a saved one)."""

    @abc.abstractmethod
    def run(
        self, model: Any, feeds: dict[str, np.ndarray], *, provider: str = "cpu"
    ) -> tuple[dict[str, np.ndarray], str]:
        """The outputs by name of ``model`` (a model, or the path of a saved one: verification
        runs the file it wrote) on ``feeds`` (arrays by input name; float inputs come as
        float32 and are converted to the declared type), and the name of what computed them."""

    def calibrate(
        self, model: Any, batches: Iterable[dict[str, np.ndarray]], *, histograms: bool = False
    ) -> Ranges:
        """The :class:`~graphamp.numerics.ranges.Ranges` of ``model``'s float32 values (keyed by the
        names its OpGraph gives them) over ``batches``, for the ``range`` rule; with
        ``histograms``, the activations matrix ops read also get their binade histograms
        (``TensorRange.log2_counts``, float8's ``fp8_range`` rule). Optional."""
        raise GraphampError(f"calibration is not available for {self.name} models")

    def label(self, source: object) -> str:
        """The model's name in a plan."""
        if isinstance(source, str | Path):
            return Path(source).name
        return "model"
