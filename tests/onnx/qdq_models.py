"""QDQ models as onnxruntime's quantizer writes them (``quantize_static``, QDQ format, int8,
calibrated on a few random batches): the zoo's small CNN and a Hugging Face ViT from a config,
at a chosen opset. Built, not downloaded; for the QDQ tests and tools/bench/bench_deploy.py."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import version_converter

from graphamp.numerics.verify import random_inputs

QDQ_MODELS = ("resnet", "vit")


def float_model(name: str, path: Path, opset: int) -> Path:
    """``name`` (a zoo model, or ``vit``) exported by torch.onnx (TorchScript, opset 17) and
    converted to ``opset``."""
    import torch

    from graphamp.models import build

    if name == "vit":
        from tests.hf_models import hf_model

        module = hf_model("vit")
        inputs: tuple[torch.Tensor, ...] = (torch.randn(1, 3, 32, 32),)
    else:
        module, inputs = build(name, "small")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, inputs, str(path), dynamo=False, opset_version=17)
    model = version_converter.convert_version(onnx.load(str(path)), opset)
    onnx.save(model, str(path))
    return path


def qdq_model(name: str, folder: Path, opset: int) -> Path:
    """``name`` quantized by onnxruntime's ``quantize_static`` into QDQ form at ``opset``."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    folder.mkdir(parents=True, exist_ok=True)
    source = float_model(name, folder / f"{name}-opset{opset}.float.onnx", opset)
    proto = onnx.load(str(source))
    batches = [random_inputs(proto, seed=seed) for seed in range(4)]

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(batches)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.left, None)

    target = folder / f"{name}-opset{opset}.qdq.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_static(
            str(source),
            str(target),
            Batches(),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
        )
    return target
