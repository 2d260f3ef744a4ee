"""Graphs nobody here wrote: small Hugging Face models (random weights, built from configs)
(LLaMA, Qwen2 and Qwen3 with grouped-query attention, GPT-2, BERT, ViT) exported by torch.onnx's
dynamo exporter at opset 18 and 23 (opset 23 brings Attention and
RMSNormalization). Each converts into a model onnxruntime loads, whose MatMuls read float16,
within tolerance of float32 under the faithful evaluator, and converting it again changes no
byte."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch

import graphamp.onnx as gonnx
from graphamp.numerics import verify
from graphamp.onnx.numerics.runtime import check_loads
from tests.hf_models import hf_model

pytestmark = pytest.mark.slow  # every test converts torch.onnx dynamo exports of HF models


@pytest.fixture(scope="module")
def exported(tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("hf")
    cache: dict[tuple[str, int], object] = {}

    def get(name: str, opset: int):  # type: ignore[no-untyped-def]
        if (name, opset) not in cache:
            generator = torch.Generator().manual_seed(0)
            ids = (
                torch.randn(1, 3, 32, 32, generator=generator)
                if name == "vit"
                else torch.randint(1, 96, (1, 8), generator=generator)
            )
            path = folder / f"{name}{opset}.onnx"
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                program = torch.onnx.export(
                    hf_model(name, lm_head=name != "vit"),
                    (ids,),
                    dynamo=True,
                    opset_version=opset,
                    verbose=False,
                )
            program.save(str(path))
            cache[(name, opset)] = path
        return cache[(name, opset)]

    return get


@pytest.mark.parametrize("opset", [18, 23])
@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "gpt2", "bert", "vit"])
def test_hf_export_converts_runs_and_is_a_fixed_point(exported, tmp_path, name, opset):
    """(Qwen3 normalises q and k per head, over a 4-D value: below opset 23 that norm is no
    Skip norm of onnxruntime's, which takes rank 2 or 3 and checks it when it runs; the
    faithful evaluator runs the model, so a refusal there fails the test.)"""
    source = exported(name, opset)
    result = gonnx.convert(source)
    target = tmp_path / "out.onnx"
    gonnx.save(result.model, target)
    assert check_loads(source, target) == []  # onnxruntime loads it: no refusal, no warning
    out = onnx.load(str(target))
    matmuls = [n for n, d in result.plan.nodes.items() if d.op == "MatMul"]
    assert matmuls and all(result.plan.nodes[n].precision == "float16" for n in matmuls)
    original = onnx.load(str(source))
    feeds = verify.random_inputs(original, seed=1)
    report = verify.verify(original, out, feeds, rtol=1e-2)
    assert report.ok, [(o.name, o.max_rel_error, o.nan_inf) for o in report.outputs]
    assert "rounding emulated" in report.provider
    again = gonnx.convert(out).to_proto().SerializeToString()
    assert again == result.to_proto().SerializeToString()
    if opset == 23 and name == "llama":
        ops = {node.op_type for node in original.graph.node}
        assert {"Attention", "RMSNormalization"} <= ops, "opset 23 exports the fused ops"
        attention = [n for n in out.graph.node if n.op_type == "Attention"]
        assert attention and all(
            result.plan.nodes[n.name].precision == "float16" for n in attention
        )
        for node in attention:  # the fused softmax stays float32, as a Softmax op would
            assert onnx.helper.get_node_attr_value(node, "softmax_precision") == 1
    assert np.isfinite(report.outputs[0].max_abs_error)


def casts(proto: onnx.ModelProto) -> int:
    return sum(node.op_type == "Cast" for node in proto.graph.node)


@pytest.mark.parametrize("opset", [18, 23])
@pytest.mark.parametrize("name", ["llama", "qwen2", "gpt2", "bert", "vit"])
def test_hf_export_places_at_most_the_tools_casts_plus_two(exported, name, opset):
    """As onnxruntime's float16 tool, plus 2; and where an opset-18 decoder writes its RMSNorm
    out (Pow, ReduceMean, ...), two more per norm: its statistics stay float32 (see the test
    below for why), as HF's own float16 code keeps them."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    source = onnx.load(str(exported(name, opset)))
    ours = gonnx.convert(source, keep_io_types=True).to_proto()
    tool = OnnxModel(onnx.load(str(exported(name, opset))))
    tool.convert_float_to_float16(keep_io_types=True)
    decomposed_norms = sum(node.op_type == "ReduceMean" for node in source.graph.node)
    if name in ("llama", "qwen2") and opset == 18:
        assert decomposed_norms == 5  # two per layer and the final one
    else:
        decomposed_norms = 0
    assert casts(ours) <= casts(tool.model) + 2 + 2 * decomposed_norms, (
        casts(ours),
        casts(tool.model),
    )


def test_decomposed_rmsnorm_stays_right_with_hidden_values_past_256(exported):
    """LLMs' hidden states carry a few channels in the thousands ("massive activations"):
    squared, they overflow float16. With two embedding channels at +-2000, graphamp's output
    (the norm's statistics float32) matches float32; the same graph with Pow and ReduceMean
    forced low (what an all-float16 tool writes) loses the output entirely."""
    source = onnx.load(str(exported("llama", 18)))
    for init in source.graph.initializer:
        if init.name == "model.embed_tokens.weight":
            table = onnx.numpy_helper.to_array(init).copy()
            table[:, :2] = 2000.0 * np.sign(table[:, :2])
            init.CopyFrom(onnx.numpy_helper.from_array(table, init.name))
    feeds = verify.random_inputs(source, seed=1)
    ours = gonnx.convert(source, keep_io_types=True).to_proto()
    report = verify.verify(source, ours, feeds, rtol=1e-2)
    assert report.ok and report.outputs[0].max_rel_error < 5e-3
    forced = gonnx.convert(source, keep_io_types=True, allow=["Pow", "ReduceMean"]).to_proto()
    broken = verify.verify(source, forced, feeds, rtol=1e-2)
    assert broken.outputs[0].max_rel_error > 0.5 or broken.outputs[0].nan_inf
