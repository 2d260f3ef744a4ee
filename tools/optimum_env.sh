#!/usr/bin/env bash
# Hugging Face Optimum's ONNX exporter and ORTModel classes (optimum-onnx) in a virtual
# environment of their own: optimum-onnx pins its own transformers, which is not the one the
# project's .venv holds. The tests and tools/bench/bench_control_flow.py export small seq2seq and
# causal models with it and generate with ORTModelForSeq2SeqLM / ORTModelForCausalLM; they run
# tools/bench/optimum_models.py with this interpreter, never import optimum themselves.
#
# The folder is $GRAPHAMP_OPTIMUM_ENV (default .venv-optimum, git-ignored). torch is installed
# first, pinned to the CPU build (torch==2.13.0; any other request pulls a multi-GB CUDA build),
# then optimum-onnx with onnxruntime, so that its requirements find the pin satisfied. Safe to
# run again (a finished environment is only checked); prints the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GRAPHAMP_OPTIMUM_ENV:-.venv-optimum}
PINS=("torch==2.13.0" "optimum-onnx[onnxruntime]==0.1.0")
STAMP="$VENV/.graphamp-pins"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "${PINS[*]}" ]; then
  # a run stopped while it made the environment leaves one without pip: make it again
  "$VENV/bin/python" -m pip --version >/dev/null 2>&1 || python3 -m venv --clear "$VENV" >&2
  PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  "${PIP[@]}" "${PINS[0]}" >&2
  "${PIP[@]}" "${PINS[@]}" >&2
  "$VENV/bin/python" -c "import optimum.onnxruntime, optimum.exporters.onnx" >/dev/null
  echo "${PINS[*]}" > "$STAMP"
fi
echo "$(cd "$VENV" && pwd)/bin/python"
