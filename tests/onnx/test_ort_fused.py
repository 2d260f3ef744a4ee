"""Graphs after onnxruntime's transformer optimizer, full of com.microsoft fused ops
(Attention, SkipLayerNormalization, BiasGelu, Gelu, SkipSimplifiedLayerNormalization): the
zoo's BERT and GPT, Hugging Face BERT (TorchScript and dynamo exports) and LLaMA and Qwen2
(dynamo) go through ``optimize_model``, then graphamp. Each output
loads in onnxruntime; its error under the faithful evaluator is within max(5e-3, 2x) that of
onnxruntime's own float16 tool; every matrix op and fused attention reads float16; it has at
most the tool's Casts + 2; and converting it again changes no byte."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
import torch

import graphamp.onnx as gonnx
from graphamp.lists import matrix_ops
from graphamp.numerics import verify
from graphamp.onnx.numerics.runtime import check_loads
from tests.hf_models import hf_model


class LastHidden(torch.nn.Module):
    """input_ids -> last hidden state (the TorchScript exporter takes no keyword inputs)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).last_hidden_state


def zoo(name: str) -> Callable[[Path], None]:
    def export(path: Path) -> None:
        from graphamp.models import export_onnx

        export_onnx(name, path, "small")

    return export


def hf_export(name: str, dynamo: bool) -> Callable[[Path], None]:
    def export(path: Path) -> None:
        ids = torch.randint(1, 96, (1, 8), generator=torch.Generator().manual_seed(0))
        model = hf_model(name)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            if dynamo:
                program = torch.onnx.export(
                    model, (ids,), dynamo=True, opset_version=18, verbose=False
                )
                program.save(str(path))
            else:
                torch.onnx.export(
                    LastHidden(model),
                    (ids,),
                    str(path),
                    dynamo=False,
                    opset_version=17,
                    input_names=["input_ids"],
                    output_names=["hidden"],
                    dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}},
                )

    return export


CASES = {
    "zoo-bert": (zoo("bert"), "bert", {"Attention", "SkipLayerNormalization"}),
    # model_type "gpt2" writes a model onnxruntime itself refuses here (a Transpose of the wrong
    # rank): the BERT fusions are the ones that hold
    "zoo-gpt": (zoo("gpt"), "bert", {"SkipLayerNormalization"}),
    "hf-bert-torchscript": (
        hf_export("bert", False),
        "bert",
        {"SkipLayerNormalization", "BiasGelu"},
    ),
    "hf-bert-dynamo": (hf_export("bert", True), "bert", {"SkipLayerNormalization", "Gelu"}),
    # the decoders' RMSNorms become SkipSimplifiedLayerNormalization (com.microsoft) and
    # SimplifiedLayerNormalization, which onnxruntime registers in ONNX's own domain
    "hf-llama-dynamo": (hf_export("llama", True), "gpt2", {"SkipSimplifiedLayerNormalization"}),
    "hf-qwen2-dynamo": (hf_export("qwen2", True), "gpt2", {"SkipSimplifiedLayerNormalization"}),
}


def optimized(case: str, folder: Path) -> Path:
    from onnxruntime.transformers.optimizer import optimize_model

    export, model_type, fused = CASES[case]
    source, target = folder / f"{case}.onnx", folder / f"{case}.opt.onnx"
    export(source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimize_model(
            str(source), model_type=model_type, num_heads=4, hidden_size=64
        ).save_model_to_file(str(target))
    ops = {n.op_type for n in onnx.load(str(target)).graph.node if n.domain == "com.microsoft"}
    assert fused <= ops, f"the optimizer fused {ops}"
    return target


def ort_float16(path: Path) -> onnx.ModelProto:
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(path)))
    model.convert_float_to_float16(keep_io_types=True)
    return model.model


def casts(proto: onnx.ModelProto) -> int:
    return sum(node.op_type == "Cast" for node in proto.graph.node)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_graph_converts_like_onnxruntimes_tool_or_better(tmp_path, case):
    source = optimized(case, tmp_path)
    result = gonnx.convert(source, keep_io_types=True)
    target = tmp_path / "out.onnx"
    gonnx.save(result.model, target)
    assert check_loads(source, target) == []
    out = onnx.load(str(target))
    matrix = [d for d in result.plan.nodes.values() if d.op in matrix_ops("onnx")]
    assert matrix and all(d.precision == "float16" for d in matrix), [
        (d.op, d.precision, d.reason) for d in matrix if d.precision != "float16"
    ]
    fused = [d for d in result.plan.nodes.values() if d.op.startswith("com.microsoft.")]
    assert fused and all(d.precision == "float16" for d in fused)
    tool = ort_float16(source)
    assert casts(out) <= casts(tool) + 2, (casts(out), casts(tool))
    original = onnx.load(str(source))
    feeds = verify.random_inputs(original, seed=1)
    ours = verify.verify(original, out, feeds, rtol=1e-2)
    theirs = verify.verify(original, tool, feeds, rtol=1e-2)
    assert "rounding emulated" in ours.provider
    for mine, reference in zip(ours.outputs, theirs.outputs, strict=True):
        assert mine.nan_inf == 0
        assert mine.max_rel_error <= max(5e-3, 2 * reference.max_rel_error), (
            mine.name,
            mine.max_rel_error,
            reference.max_rel_error,
        )
    again = gonnx.convert(out, keep_io_types=True).to_proto().SerializeToString()
    assert again == result.to_proto().SerializeToString()


def test_only_the_optimizers_own_ops_are_taken_from_onnxruntime_in_onnxs_domain():
    """onnxruntime registers SimplifiedLayerNormalization (and LayerNormalization before opset
    17) in ONNX's domain, and its optimizer writes them there: they convert and load. Its other
    registrations there (ImageScaler, Crop: experimental leftovers it no longer loads) stay
    unknown ops, one line, as before."""
    from onnx import TensorProto, helper, numpy_helper

    from graphamp.errors import GraphampError
    from tests.helpers import model

    scale = numpy_helper.from_array(torch.ones(4).numpy(), "scale")
    rms = helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y"], name="rms")
    proto = model([rms], initializers=[scale], opset=18, shape=(2, 4))
    # ONNX inference does not know the op: the output declares its shape, as exporters write it
    proto.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]))
    result = gonnx.convert(proto)
    assert result.plan.nodes["rms"].precision == "float16"
    scaler = helper.make_node("ImageScaler", ["x"], ["y"], name="scaler")
    refused = r"no op 'ImageScaler' in domain 'ai\.onnx' at opset 13"
    with pytest.raises(GraphampError, match=refused):
        gonnx.convert(model([scaler], opset=13, input_types={"x": TensorProto.FLOAT}))
