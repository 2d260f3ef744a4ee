"""tools/bench/traffic_steps.py, issue 42's estimate of a GPU step from the bytes and FLOPs of
its ops, kept working: what the recorder counts for an op, the linear fit to a batch size, the
CUDA kernels put in place of the CPU's, and a whole run on the tiny BERT (no time is measured:
the estimate is arithmetic on recorded sizes)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import load_tool


@pytest.fixture(scope="module")
def tool():
    return load_tool("tools/bench/traffic_steps.py")


def test_an_op_reads_its_inputs_and_writes_its_outputs_views_and_allocations_count_nothing(tool):
    a, b = torch.randn(1000), torch.randn(1000)
    with tool.Recorder() as recorder:
        c = a + b
        c.view(10, 100)  # a view: no kernel
        torch.empty(10)  # an allocation: no kernel
        c.mul_(2.0)  # in place: writes its argument
        torch.mm(torch.randn(8, 4).half(), torch.randn(4, 2).half())  # float16, emulated
    names = [op.name for op in recorder.ops]
    add, mul_ = (next(op for op in recorder.ops if op.name == n) for n in ("add", "mul_"))
    assert (add.read, add.written, add.flops) == (8000, 4000, 0)
    assert (mul_.read, mul_.written) == (4000, 4000)
    assert "view" not in names and "empty" not in names
    mm = next(op for op in recorder.ops if op.name == "mm")
    assert mm.flops == 2 * 8 * 4 * 2 and mm.read == (32 + 8) * 2 and mm.written == 16 * 2


def test_the_memory_recorder_counts_storages_alive_after_each_op_and_their_peak(tool):
    a = torch.randn(1000)  # read in the step: held from before it
    with tool.Recorder({}) as recorder:
        b = a + 1
        c = b * 2
        del b  # freed: the next op's count leaves it out
        e = torch.cat([a, a])
        del c, e
        a.sum()
    # a, c and e (4,000 + 4,000 + 8,000 bytes); 20,000 had b's free been missed
    assert recorder.peak == 16000
    assert recorder.at_peak == {"held f32": 4000, "mul f32": 4000, "cat f32": 8000}
    later = tool.Recorder(recorder.storages)  # what a next step starts with: a alone alive
    assert later.peak == 4000 and later.at_peak == {"held f32": 4000}
    with tool.Recorder({}) as resized:
        out = torch.empty(0)
        torch.add(a, 1, out=out)  # the storage grows after the recorder first saw it
        del out
        a.sum()
    assert resized.peak == 8000  # a and out's 4,000 bytes, not out's first 0


def test_peaks_are_fitted_linearly_in_the_batch(tool):
    runs = {2: tool.Memory(300, {"held": 100, "mm": 200}), 4: tool.Memory(500, {"held": 100})}
    fitted = tool.extrapolate_memory(runs, 8)
    assert fitted.peak == 900 and fitted.held == {"held": 100, "mm": 0}


def test_ops_are_fitted_linearly_in_the_batch(tool):
    runs = {
        2: [tool.Op("a", 100, 50, 10), tool.Op("b", 7, 7, 0)],
        4: [tool.Op("a", 180, 90, 20), tool.Op("b", 7, 7, 0)],
    }
    fitted = tool.extrapolate(runs, 32)
    assert [(o.read, o.written, o.flops) for o in fitted] == [(1300, 650, 160), (7, 7, 0)]
    with pytest.raises(SystemExit, match="different ops"):
        tool.extrapolate({2: runs[2], 4: runs[4][:1]}, 32)


def test_cuda_kernels_dropout_is_one_fused_op_and_softmax_to_float_one_kernel(tool):
    x = torch.randn(64, 64, requires_grad=True)
    with tool.cuda_kernels(), tool.Recorder() as recorder:
        torch.nn.functional.dropout(x, 0.1, training=True).sum().backward()
    names = [op.name for op in recorder.ops]
    assert "native_dropout" in names and "native_dropout_backward" in names
    assert "bernoulli_" not in names
    scores = torch.randn(4, 8).half()
    autocast = torch.autocast("cpu", dtype=torch.float16)
    with tool.Recorder() as recorder, autocast, tool.cuda_autocast_lists():
        probabilities = torch.softmax(scores, dim=-1)
    assert probabilities.dtype == torch.float32
    (softmax,) = recorder.ops
    assert softmax.name == "_softmax" and (softmax.read, softmax.written) == (64, 128)


def test_a_tiny_bert_step_of_each_configuration_is_recorded_and_estimated(tool, capsys):
    tool.main(["--scale", "tiny", "--batches", "2", "4", "--at", "8", "--top", "5"])
    text = capsys.readouterr().out
    assert "recorded autocast at batch 4" in text and "recorded graphamp at batch 4" in text
    totals = [line.split() for line in text.splitlines() if "kernels," in line]
    assert [row[0] for row in totals] == ["autocast", "graphamp"]
    assert all(float(row[-2]) > 0 for row in totals)  # milliseconds estimated
    assert "estimated speed graphamp / autocast" in text
    peaks = {
        line.split()[0]: float(line.split()[1])
        for line in text.split("estimated peak memory")[1].splitlines()
        if line.startswith("  ") and "GiB" in line
    }
    assert set(peaks) == {"autocast", "graphamp"} and all(v > 0 for v in peaks.values())
