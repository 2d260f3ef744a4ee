"""Optimum's exports, converted as a folder, load in Optimum's ORTModel classes with their cache
and generate (docs/onnx.md's example runs as written): a T5 seq2seq export (encoder, decoder,
decoder with past, merged decoder, one of them with its weights in an external data file) and
a Llama causal export, each built from a small config with random weights (nothing
downloaded).

Optimum runs in an environment of its own (tools/optimum_env.sh: optimum-onnx pins its own
transformers), through tools/bench/optimum_models.py in a subprocess. The tokens a converted folder
generates are compared on its faithful copy (tests/optimum_exports.py: every float16 value
rounded as stored), since onnxruntime's CPU provider would compute the float16 ops in
float32. These tests are skipped only where that environment cannot be made; in CI
(``CI`` set) that is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from graphamp.cli import main
from tests.helpers import doc_blocks
from tests.optimum_exports import (
    MODELS,
    SEQ2SEQ_FILES,
    OptimumUnavailable,
    casts,
    emulated_folder,
    export,
    generate,
    low_values,
    matrix_ops,
    optimum_python,
)

pytestmark = pytest.mark.slow  # Optimum runs in a virtual environment of its own

F16 = onnx.TensorProto.FLOAT16


@pytest.fixture(scope="module")
def optimum():
    try:
        return optimum_python()
    except OptimumUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Optimum tests: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def t5(optimum, tmp_path_factory):
    """docs/onnx.md's Optimum examples, run as written on a local T5 checkpoint: the export and
    the conversion of its folder, then generation with the converted folder. Returns the
    export, its decoder_model then keeping its weights in decoder_model.onnx_data (as
    Optimum writes a model over 2 GB)."""
    work = tmp_path_factory.mktemp("readme")
    made = subprocess.run(
        [str(optimum), str(MODELS), "checkpoint", "t5", str(work / "t5-checkpoint")],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    (commands,) = doc_blocks("docs/onnx.md", "sh", "optimum")
    path = os.pathsep.join([str(optimum.parent), str(Path(sys.executable).parent)])
    env = {**os.environ, "PATH": f"{path}{os.pathsep}{os.environ['PATH']}"}
    ran = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", commands], cwd=work, env=env, capture_output=True
    )
    assert ran.returncode == 0, ran.stderr.decode()[-3000:]
    assert sorted(p.name for p in (work / "t5-plans").iterdir()) == sorted(
        name.replace(".onnx", ".plan.json") for name in SEQ2SEQ_FILES
    )
    (loading,) = doc_blocks("docs/onnx.md", "python", "optimum")
    generated = subprocess.run(
        [str(optimum), "-c", loading], cwd=work, env=env, capture_output=True, text=True
    )
    assert generated.returncode == 0, generated.stderr[-3000:]
    assert generated.stdout.startswith("['")
    folder = work / "t5-onnx"
    decoder = folder / "decoder_model.onnx"
    onnx.save_model(
        onnx.load(str(decoder)),
        str(decoder),
        save_as_external_data=True,
        location="decoder_model.onnx_data",
        size_threshold=1024,
    )
    return folder


def test_a_converted_t5_folder_loads_in_optimum_and_generates_the_same_tokens(
    optimum, t5, tmp_path
):
    out, faithful = tmp_path / "fp16", tmp_path / "fp16-emulated"
    assert main(["convert", str(t5), "-o", str(out), "--plan", str(tmp_path / "plans")]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert "decoder_model.onnx.data" in names and "decoder_model.onnx_data" not in names
    for name in ("config.json", "generation_config.json", "tokenizer.json"):
        assert (out / name).read_bytes() == (t5 / name).read_bytes()
    # every file passes onnx.checker's full check (no op of onnxruntime's own in ONNX's
    # domain: a T5 RMSNorm with no residual Add before it keeps its ops)
    for name in SEQ2SEQ_FILES:
        onnx.checker.check_model(str(out / name), full_check=True)
    # every MatMul/Gemm of every file in float16, the merged decoder's inside its If included
    for name in SEQ2SEQ_FILES:
        ops = matrix_ops(out / name)
        assert ops and all(dtype == F16 for _, _, dtype in ops), (name, ops)
    # the merged decoder no dearer in Casts than the two decoders it merges (fuse_norms
    # reaches inside its If's branches as it does the main graph)
    unmerged_casts = casts(out / "decoder_model.onnx") + casts(out / "decoder_with_past_model.onnx")
    assert casts(out / "decoder_model_merged.onnx") <= unmerged_casts
    emulated_folder(out, faithful)
    assert not any(low_values(onnx.load(str(faithful / n))) for n in SEQ2SEQ_FILES)
    float32, merged, unmerged, faithful_merged, faithful_unmerged = generate(
        optimum, t5, out, f"{out}#unmerged", faithful, f"{faithful}#unmerged"
    )
    assert merged["decoders"] == ["decoder_model_merged.onnx"]
    assert unmerged["decoders"] == ["decoder_model.onnx", "decoder_with_past_model.onnx"]
    for result in (merged, unmerged):  # the converted folder itself loads and generates
        assert [len(tokens) for tokens in result["tokens"]] == [16] * 4
    # not one token over and over: the comparison below compares something
    assert len({token for tokens in float32["tokens"] for token in tokens}) > 8
    assert faithful_merged["tokens"] == float32["tokens"]
    assert faithful_unmerged["tokens"] == float32["tokens"]


def test_a_converted_llama_folder_loads_in_optimum_and_generates(optimum, tmp_path):
    folder = export(optimum, "llama", tmp_path / "export")
    out, faithful = tmp_path / "fp16", tmp_path / "fp16-emulated"
    assert main(["convert", str(folder), "-o", str(out)]) == 0
    ops = matrix_ops(out / "model.onnx")
    assert ops and all(dtype == F16 for _, _, dtype in ops)
    emulated_folder(out, faithful)
    float32, converted, emulated = generate(optimum, folder, out, faithful)
    assert converted["decoders"] == ["model.onnx"]
    assert [len(tokens) for tokens in converted["tokens"]] == [16] * 4
    assert len({token for tokens in float32["tokens"] for token in tokens}) > 8
    assert emulated["tokens"] == float32["tokens"]
    shutil.rmtree(faithful)
