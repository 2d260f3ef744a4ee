"""tools/gpu_check.sh on a machine without a GPU: in its parse mode every part's command line is
run with a deadline already past, so each starts nothing and says what was not measured. That
checks the script's flags against bench_gpu.py's; the parts themselves run at tiny sizes in
test_bench_gpu.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def gpu_check(out: Path, timeout: int, **env: str) -> subprocess.CompletedProcess[str]:
    """Runs tools/gpu_check.sh into ``out`` with this Python and ``env`` on top of ours."""
    return subprocess.run(
        ["bash", str(ROOT / "tools/gpu_check.sh"), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable, **env},
        check=False,
        timeout=timeout,
    )


def test_every_part_of_the_gpu_check_runs_its_command_line(tmp_path):
    done = gpu_check(tmp_path, 900, GPU_CHECK_DRY_RUN="parse")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "# device: no GPU (dry run)" in done.stderr
    assert "issue 42's parts took" in done.stdout
    assert "stopped" not in done.stdout and "out of time" not in done.stdout, done.stdout
    notes = {
        "bench-gpu-train-resnet50.md": "resnet50 float32",
        "bench-gpu-train-bert-base.md": "bert-base float32",
        "bench-gpu-curves-resnet50.md": "resnet50 float16 curves",
        "bench-gpu-infer.md": "resnet50 inference",
    }
    for name, first in notes.items():
        text = (tmp_path / name).read_text()
        assert "Not measured, past the time budget (--deadline)" in text, name
        assert first in text, name


def test_without_a_gpu_it_stops_at_once_saying_so(tmp_path):
    done = gpu_check(tmp_path, 600, GPU_CHECK_DRY_RUN="0")
    assert done.returncode != 0
    assert "torch sees no CUDA device" in done.stderr
    assert not list(tmp_path.glob("*.md"))


def test_parts_runs_only_the_named_parts(tmp_path):
    done = gpu_check(tmp_path, 900, GPU_CHECK_DRY_RUN="parse", PARTS="bert-base curves")
    assert done.returncode == 0, done.stderr[-3000:]
    written = sorted(path.name for path in tmp_path.glob("*.md"))
    assert written == ["bench-gpu-curves-resnet50.md", "bench-gpu-train-bert-base.md"]


def test_a_misspelled_part_is_refused_naming_it(tmp_path):
    done = gpu_check(tmp_path, 600, GPU_CHECK_DRY_RUN="parse", PARTS="bert")
    assert done.returncode == 2
    assert "PARTS names 'bert'" in done.stderr
    assert not list(tmp_path.glob("*.md"))


def test_profile_passes_its_flag_and_a_bad_value_is_refused(tmp_path):
    done = gpu_check(
        tmp_path / "on", 900, GPU_CHECK_DRY_RUN="parse", PARTS="bert-base", PROFILE="1"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stopped" not in done.stdout, done.stdout  # bench_gpu.py took --profile
    assert (tmp_path / "on" / "bench-gpu-train-bert-base.md").exists()
    refused = gpu_check(tmp_path / "bad", 600, GPU_CHECK_DRY_RUN="parse", PROFILE="yes")
    assert refused.returncode == 2
    assert "PROFILE=yes" in refused.stderr


def carried_onnxruntime(tmp_path: Path) -> Path:
    """Parts of a stand-in ``onnxruntime`` wheel (a version no installed one has), packed as
    onnxruntime-gpu is packed to travel to a GPU machine (tools/gpu/wheel_parts.py)."""
    import zipfile

    if str(ROOT / "tools" / "gpu") not in sys.path:
        sys.path.insert(0, str(ROOT / "tools" / "gpu"))
    import wheel_parts

    wheel = tmp_path / "onnxruntime-0.0+carried-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(
            "onnxruntime/__init__.py",
            "__version__ = '0.0+carried'\n"
            "def get_available_providers():\n    return ['CPUExecutionProvider']\n",
        )
        archive.writestr("onnxruntime/padding.bin", os.urandom(100 * 1024))
    parts = tmp_path / "parts"
    wheel_parts.pack([wheel], parts, 64 * 1024, preset=1)
    return parts


def test_onnxruntime_carried_in_parts_is_unpacked_and_imported_first(tmp_path):
    parts = carried_onnxruntime(tmp_path)
    env = {"GPU_CHECK_DRY_RUN": "parse", "PARTS": "bert-base", "ORT_GPU_PARTS": str(parts)}
    done = gpu_check(tmp_path / "out", 900, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "unpacked 2 files of onnxruntime-0.0+carried" in done.stdout
    assert "| onnxruntime 0.0+carried at /" in done.stderr  # not the installed one
    (parts / "part-2" / "data").unlink()
    missing = gpu_check(
        tmp_path / "again", 600, GPU_CHECK_DRY_RUN="parse", ORT_GPU_PARTS=str(parts)
    )
    assert missing.returncode == 2
    assert "part-2 missing" in missing.stderr
    assert not list((tmp_path / "again").glob("*.md"))
