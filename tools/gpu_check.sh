#!/usr/bin/env bash
# Every GPU figure the project has, in one command, on a machine with a CUDA device:
#
#     bash tools/gpu_check.sh [OUT_DIR]
#
# It needs the dev environment (bash tools/setup-dev.sh) with a CUDA build of torch and
# onnxruntime-gpu; it stops at once, saying what is missing, when there is no GPU. Results
# (Markdown on stdout, JSON in OUT_DIR, default gpu-results/) go to BENCHMARKS.md by hand,
# with the device name it prints first.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-results}
mkdir -p "$out"
py=${PYTHON:-.venv/bin/python}

"$py" - <<'PY'
import sys
import onnxruntime, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check: torch sees no CUDA device (install a CUDA build of torch)")
if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
    sys.exit("gpu_check: onnxruntime has no CUDAExecutionProvider (pip install onnxruntime-gpu)")
print("# device:", torch.cuda.get_device_name(0), "| onnxruntime", onnxruntime.__version__)
PY

echo "## The demo, verified natively on the GPU (float16 kernels, not emulation)"
"$py" -m graphamp.cli demo --provider cuda
echo "## Deployed graphs: Casts, error and onnxruntime CUDA latency per tool"
"$py" tools/bench/bench_deploy.py --gpu --full --runs 1 --json "$out/deploy.json"
echo "## The faithful evaluator against the GPU's float16 (planted faults; TF32 on and off)"
"$py" tools/gpu/gpu_numerics.py
echo "## Whole training steps on the GPU (float16, dynamic loss scaling)"
"$py" tools/bench/bench_train.py --device cuda --width 4096 --batch 512
echo "## Mixed precision's promise: training speed-up over float32, inference latency (issue 32)"
# One part per command: each takes minutes, not the whole set at once, and writes its own files.
"$py" tools/gpu/bench_gpu.py --part train --models resnet50 --profile --out "$out"
"$py" tools/gpu/bench_gpu.py --part train --models bert-base --profile --out "$out"
"$py" tools/gpu/bench_gpu.py --part curves --dtypes float16 --out "$out"
"$py" tools/gpu/bench_gpu.py --part infer --profile --out "$out"
echo "## ONNX conversion and onnxruntime latency (zoo, full size)"
"$py" tools/bench/bench_onnx.py --size full --chain 0 --json "$out/onnx.json"  # CPU-side conversion figures
echo "## Float8 (issue 41): float8 GEMMs and a LLaMA-3-8B block's training step against bfloat16 and torchao"
"$py" tools/gpu/gpu_fp8.py --json "$out/fp8.json"
