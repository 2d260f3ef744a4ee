#!/usr/bin/env bash
# The wheel as a user installs it: build it from this repository, install it with its
# dependencies (and the CPU torch the demo builds its models with, pinned) into a fresh virtual
# environment outside the source tree, and run graphamp there.
#
#   bash tools/ci/check_wheel.sh            # prints the commands' output; exit 0 when all ran
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d /tmp/graphamp-wheel.XXXXXX)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip
"$work/venv/bin/python" -m pip wheel -q --no-deps "$repo" -w "$work/dist" 2>&1 | tee "$work/build.log"
if grep -qi "BuildBackendWarning\|deprecat" "$work/build.log"; then
  echo "check_wheel: the build warned (see above)" >&2
  exit 1
fi
"$work/venv/bin/python" -m pip install -q torch==2.13.0 "$work"/dist/graphamp-*.whl
cd "$work"  # outside the source tree: nothing of it is importable from here
"$work/venv/bin/graphamp" --version
"$work/venv/bin/python" -c "import graphamp, sys; assert graphamp.__file__.startswith('$work'), graphamp.__file__; print('graphamp from', graphamp.__file__)"
"$work/venv/bin/graphamp" demo
"$work/venv/bin/graphamp" demo --model simplenet --keep "$work/kept"
"$work/venv/bin/graphamp" plan "$work/kept/simplenet.onnx" --format html -o "$work/plan.html"
grep -q "viewer" "$work/plan.html"
echo "check_wheel: ok"
