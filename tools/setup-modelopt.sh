#!/usr/bin/env bash
# NVIDIA ModelOpt AutoCast (modelopt.onnx.autocast), the third converter tools/bench/bench_deploy.py
# compares against, in a virtual environment of its own: .venv-modelopt (git-ignored).
#
# nvidia-modelopt is installed with --no-deps: its requirements pull a CUDA build of torch and
# onnxruntime-gpu. Only what `import modelopt.onnx.autocast` and a CPU conversion need is
# installed beside it, each pinned where modelopt pins it (onnx 1.21, onnxruntime 1.24, the CPU
# build); torch, where an import needs it, is the CPU build (torch==2.13.0 only). Safe to run
# again; prints the interpreter to give bench_deploy.py as MODELOPT_PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-modelopt
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)
"${PIP[@]}" --no-deps "nvidia-modelopt==0.47.0"
"${PIP[@]}" "onnx~=1.21.0" "onnxruntime~=1.24.2" "onnx-graphsurgeon>=0.6.1" \
    "polygraphy>=0.53.4" onnxscript onnxslim ml_dtypes numpy packaging rich tqdm pyyaml \
    pydantic omegaconf regex safetensors scipy "pulp<4.0" lief "onnxconverter-common~=1.16.0" \
    nvidia-ml-py "torch==2.13.0"
"$VENV/bin/python" -c "import modelopt.onnx.autocast" >/dev/null
echo "$PWD/$VENV/bin/python"
