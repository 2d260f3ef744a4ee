"""--target: an op goes low only where onnxruntime's provider has a kernel for the low type
(rule no_kernel otherwise), from the table transcribed from onnxruntime's OperatorKernels.md;
tools/lists/kernel_table.py parses that document."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import onnx

import graphamp.onnx as gonnx
from graphamp.cli import main
from graphamp.onnx.dialect import kernels
from tests.helpers import chain

ROOT = Path(__file__).resolve().parents[2]

# Rows as OperatorKernels.md writes them (CPU section, ai.onnx), a domain line, a continuation.
SNIPPET = """## Operators implemented by CPUExecutionProvider

| Op Name | Parameters | OpSet Version | Types Supported |
|---------|------------|---------------|-----------------|
|**Operator Domain:** *ai.onnx*||||
|Acos|*in* input:**T**<br> *out* output:**T**|22+|**T** = tensor(float)|
|||[7, 21]|**T** = tensor(float)|
|Clip|*in* X:**T**<br> *out* Y:**T**|13+|**T** = tensor(double), tensor(float), tensor(float16)|
|||12|**T** = tensor(double), tensor(float), tensor(float16)|
|**Operator Domain:** *com.microsoft*||||
|Gelu|*in* X:**T**<br> *out* Y:**T**|1+|**T** = tensor(float)|

## Operators implemented by DmlExecutionProvider

|**Operator Domain:** *ai.onnx*||||
|Abs|*in* X:**T**<br> *out* Y:**T**|13+|**T** = tensor(float), tensor(float16)|
"""


def kernel_table_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "kernel_table", ROOT / "tools/lists/kernel_table.py"
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_generator_reads_operator_kernels_rows():
    rows = list(kernel_table_module().rows(SNIPPET))
    assert rows == [
        ("cpu", "ai.onnx", "Acos", 22, 0, {"float32"}),
        ("cpu", "ai.onnx", "Acos", 7, 21, {"float32"}),
        ("cpu", "ai.onnx", "Clip", 13, 0, {"float32", "float16"}),
        ("cpu", "ai.onnx", "Clip", 12, 12, {"float32", "float16"}),
        ("cpu", "com.microsoft", "Gelu", 1, 0, {"float32"}),
    ]  # the DML section is left out


def test_the_shipped_table_names_its_source_and_covers_both_providers():
    assert "OperatorKernels.md at commit" in kernels.table_source()
    assert kernels.missing_kernel("cuda", "", "MatMul", 13, "float16") == ""
    assert kernels.missing_kernel("cpu", "", "Acos", 13, "float16")  # CPU: float32 only
    assert kernels.missing_kernel("any", "", "Acos", 13, "float16") == ""
    assert kernels.missing_kernel("cuda", "", "NoSuchOp", 13, "float16") == ""


def test_an_op_without_a_low_kernel_on_the_target_stays_float32_with_rule_no_kernel(tmp_path):
    proto = chain(["MatMul", "Exp", "Relu"])
    proto.graph.node[1].op_type = "Acos"  # in no list by default: allow it
    proto.graph.node[1].name = "acos1"
    cpu = gonnx.convert(proto, allow=["Acos"], target="cpu").plan.nodes
    assert cpu["acos1"].rule == "no_kernel"
    assert cpu["acos1"].precision == "float32"
    assert "CPUExecutionProvider" in cpu["acos1"].reason
    assert gonnx.convert(proto, allow=["Acos"], target="any").plan.nodes["acos1"].precision == (
        "float16"
    )
    path = tmp_path / "m.onnx"
    onnx.save(proto, str(path))
    out = tmp_path / "plan.json"
    args = ["plan", str(path), "--allow", "Acos", "--format", "json", "-o", str(out)]
    assert main([*args, "--target", "cpu"]) == 0
    assert '"no_kernel"' in out.read_text()
    assert '"target": "cpu"' in out.read_text()


def test_a_bad_target_in_a_policy_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(chain(["MatMul"]), str(path))
    config = tmp_path / "p.toml"
    config.write_text('[graphamp]\ntarget = "tpu"\n')
    assert main(["plan", str(path), "--config", str(config)]) == 2
    assert "target 'tpu' is not one of cuda, cpu, any" in capsys.readouterr().err


def test_default_target_is_cuda_and_matmul_has_its_kernel():
    result = gonnx.convert(chain(["MatMul"]))
    assert result.plan.policy["target"] == "cuda"
    assert {d.precision for d in result.plan.nodes.values()} == {"float16"}
