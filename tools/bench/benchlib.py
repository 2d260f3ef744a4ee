"""What the benchmarks under tools/ share: the machine they ran on, a median timer, and a
whole-process timer."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable


def machine() -> str:
    """CPU model, cores and the flags that matter for low-precision speed."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        lscpu = ""
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    model = fields.get("Model name", platform.processor()).strip()
    flags = fields.get("Flags", "").split()
    wanted = [
        f
        for f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "f16c")
        if f in flags
    ]
    import onnxruntime

    return (
        f"{model}, {os.cpu_count()} cores, flags: {' '.join(wanted) or 'none of note'}; "
        f"onnxruntime {onnxruntime.__version__}; "
        f"{gpu()}"
    )


def gpu() -> str:
    """The CUDA device torch sees, or "no GPU"."""
    try:
        import torch
    except ImportError:
        return "no GPU (torch not installed)"
    if not torch.cuda.is_available():
        return "no GPU"
    return f"GPU: {torch.cuda.get_device_name(0)}"


def median_time(
    fn: Callable[[], object], runs: int, warmup: int = 1, sync: Callable[[], object] | None = None
) -> tuple[float, object]:
    """(median seconds of ``runs`` calls after ``warmup`` untimed ones, the last result).
    ``sync`` (e.g. ``torch.cuda.synchronize``) runs before each clock read, so work queued on a
    device is counted in the call that queued it."""
    wait = sync or (lambda: None)
    result = None
    for _ in range(warmup):
        result = fn()
    times = []
    for _ in range(runs):
        wait()
        start = time.perf_counter()
        result = fn()
        wait()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def run_child(command: list[str]) -> dict[str, float]:
    """Run ``command`` as a fresh process: its wall time, CPU time (user + system, every thread)
    and peak resident memory (bytes). A failure ends the benchmark, naming the command.

    The memory and CPU time are GNU time's report of its child (``wait4`` of a child it forked):
    the kernel carries a process's peak over ``exec``, so a child of this (large) Python process
    measured directly would report this one's. On a shared machine the CPU time is the steadier
    figure (wall time waits for cores the others hold); it leaves out time spent waiting for the
    disk."""
    start = time.perf_counter()
    done = subprocess.run(
        ["/usr/bin/time", "-f", "graphamp-bench-rss %M %U %S", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    kib, user, system = next(
        line.split()[1:]
        for line in reversed(done.stderr.splitlines())
        if line.startswith("graphamp-bench-rss")
    )
    return {"seconds": seconds, "cpu": float(user) + float(system), "peak_rss": int(kib) * 1024}
