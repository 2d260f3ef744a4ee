"""Reference models built in code with random weights (installed as ``graphamp.models``).

Each entry builds a float32 ``torch.nn.Module`` and example inputs, in a ``small`` size for
tests and the ``full`` size for benchmarks, and exports to ONNX. Nothing is downloaded.

    >>> from graphamp.models import export_onnx
    >>> export_onnx("mnist", "mnist.onnx")                                # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from graphamp.errors import GraphampError

if TYPE_CHECKING:
    from torch import nn

# Opset 22 is the first where Conv, Gemm and the pooling ops admit bfloat16.
EXPORT_OPSET = 22


@dataclass(frozen=True)
class ZooEntry:
    name: str
    module: str  # the models/ module that builds it
    builder: str  # the function in that module: size -> (module, example inputs)
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    description: str  # formatted with one size's settings (the module's ``sizes`` table)
    sizes: str = "SIZES"  # the table of sizes in the module: size -> settings

    def build_fn(self) -> Callable[[str], tuple[nn.Module, tuple[object, ...]]]:
        return getattr(importlib.import_module(f"graphamp.models.{self.module}"), self.builder)

    def describe(self, size: str) -> str:
        """What ``build(name, size)`` builds, from the settings that build it."""
        table = getattr(importlib.import_module(f"graphamp.models.{self.module}"), self.sizes)
        return self.description.format(**table[size])


ZOO: dict[str, ZooEntry] = {
    entry.name: entry
    for entry in (
        ZooEntry(
            "simplenet",
            "simplenet",
            "build",
            ("x",),
            ("y",),
            "the seeds' SimpleNet: 3 x Linear {width} with ReLU, batch {batch}",
        ),
        ZooEntry(
            "mnist",
            "mnist",
            "build",
            ("image",),
            ("probabilities",),
            "the seeds' MNIST CNN: conv, batch norm, max pool, fc, softmax; batch {batch}",
        ),
        ZooEntry(
            "resnet",
            "resnet",
            "build",
            ("image",),
            ("logits",),
            "ResNet-style CNN: bottlenecks {blocks}, width {width}, {image}x{image}, {classes} "
            "classes",
        ),
        ZooEntry(
            "bert",
            "transformer",
            "build_bert",
            ("input_ids", "token_type_ids"),
            ("hidden_states", "pooled"),
            "BERT-style encoder: {layers} layers x {hidden} wide, {heads} heads, vocab {vocab},"
            " seq {seq}",
            "BERT_SIZES",
        ),
        ZooEntry(
            "gpt",
            "transformer",
            "build_gpt",
            ("input_ids",),
            ("logits",),
            "GPT-2-style decoder: {layers} layers x {hidden} wide, {heads} heads, causal, tied LM "
            "head, vocab {vocab}, seq {seq}",
            "GPT_SIZES",
        ),
    )
}
SIZES = ("small", "full")


def build(name: str, size: str = "small", seed: int = 0) -> tuple[nn.Module, tuple[object, ...]]:
    """A float32 module in eval mode and its example inputs; weights from ``seed``."""
    torch = _torch()
    if name not in ZOO:
        raise GraphampError(f"unknown model {name!r}: choose one of {', '.join(ZOO)}")
    if size not in SIZES:
        raise GraphampError(f"unknown size {size!r}: choose one of {', '.join(SIZES)}")
    torch.manual_seed(seed)
    module, inputs = ZOO[name].build_fn()(size)
    return module.eval(), inputs


def export_onnx(
    name: str, path: str | os.PathLike[str], size: str = "small", seed: int = 0
) -> Path:
    """Build ``name`` and export it to an ONNX file at opset :data:`EXPORT_OPSET`."""
    import onnx
    from onnx import version_converter

    torch = _torch()
    module, inputs = build(name, size, seed)
    entry = ZOO[name]
    path = Path(path)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        # The TorchScript exporter names nodes after module paths (/layers.0/Gemm), which
        # deny_names rules can match; opset 17 is its newest well-supported level.
        torch.onnx.export(
            module,
            inputs,
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=list(entry.input_names),
            output_names=list(entry.output_names),
        )
    model = onnx.load(str(path), load_external_data=True)
    model = version_converter.convert_version(model, EXPORT_OPSET)
    large = model.ByteSize() > 1_900_000_000
    for stale in path.parent.glob(f"{path.name}.data"):
        stale.unlink()
    onnx.save(model, str(path), save_as_external_data=large, location=f"{path.name}.data")
    return path


def _torch() -> ModuleType:
    try:
        import torch
    except ImportError:
        raise GraphampError(
            "building the models/ zoo needs PyTorch: pip install 'graphamp[torch]'"
        ) from None
    return torch
