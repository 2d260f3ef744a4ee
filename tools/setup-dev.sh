#!/usr/bin/env bash
# Development set-up, as the README's test command runs it: a virtual environment in .venv with
# graphamp and its dev extra (the CPU build of torch, pytest, ruff, mypy, the converters compared
# against) at the releases constraints.txt pins, Chromium for the browser tests, and Optimum in
# .venv-optimum (tools/optimum_env.sh: it pins its own transformers). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-chromium.sh
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c constraints.txt -e '.[dev]'
bash tools/optimum_env.sh >/dev/null
