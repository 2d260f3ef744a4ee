"""Graphs nobody here wrote: small Hugging Face models (random weights, built from configs)
(LLaMA and Qwen2 with grouped-query attention, GPT-2, BERT, ViT) exported by torch.onnx's
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
from graphamp import verify
from graphamp.onnx.runtime import check_loads
from tests.hf_models import hf_model


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
@pytest.mark.parametrize("name", ["llama", "qwen2", "gpt2", "bert", "vit"])
def test_hf_export_converts_runs_and_is_a_fixed_point(exported, tmp_path, name, opset):
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
