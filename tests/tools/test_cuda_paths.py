"""tools/gpu/cuda_paths.py: the CUDA-only eager passes checked on a GPU. Without one it says so
(exit 2); its pieces run on the CPU: the small BERT's step (one skipped step, no host read: the
passes are for CUDA steps) and the softmax's inputs as the capture leaves them."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "gpu"))

import cuda_paths


def test_without_a_gpu_it_says_so_with_exit_status_2(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_paths.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().out


def test_the_small_bert_step_skips_its_first_step_and_reads_nothing_on_a_cpu_host():
    run = cuda_paths.trained(torch.device("cpu"), steps=2, cuda_passes=False)
    assert run["skipped"] == 1 and run["scale"] == 2.0**16  # 2**30 overflowed, then 2**16
    assert run["host reads"] == 0 and run["fused softmaxes"] == 0
    # the masked-LM loss's log-softmax backward into its gradient: on a CPU step as on a GPU's
    assert run["backwards into their gradient"] >= 1
    assert all(torch.isfinite(torch.tensor(run["losses"])))


def test_the_softmax_reads_the_scaled_scores_once_the_mask_of_zeros_is_dropped():
    lines = cuda_paths.softmax_inputs(torch.device("cpu"), depth=1)
    assert any(line.startswith("mask check:") and line.endswith("True") for line in lines)
    assert any("masks that mask nothing dropped" in line for line in lines)  # its debug line
    first = next(i for i, line in enumerate(lines) if line.startswith("%softmax"))
    assert "mul" in lines[first + 1]  # the scaled scores, no add of a mask in between


def test_each_literal_left_in_the_graph_is_described_as_the_mask_check_reads_it():
    """Where a GPU's capture keeps a mask, the next run says what its literal held there (the
    H200's kept transformers 5.17's mask of zeros, cause not found on a CPU)."""
    from graphamp.fx.dialect.capture import capture

    class Shifted(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.tensor(2.0)  # a literal no mask check drops

    module = capture(Shifted(), (torch.randn(3),), dynamic_shapes="static")
    (line,) = cuda_paths.literals(module)
    assert line.startswith("literal lifted_tensor_0: Tensor torch.float32 () on cpu, fake False")
    assert "the check reads tensor(2.)" in line and "lift_fresh_copy" in line
