#!/usr/bin/env bash
# The GPU figures, in one command, on a machine with a CUDA device:
#
#     bash tools/gpu_check.sh [OUT_DIR]          # issue 42's figures, in at most BUDGET_S (480) s
#     bash tools/gpu_check.sh --all [OUT_DIR]    # then every other GPU figure (float8 too)
#
# Python: $PYTHON, else .venv/bin/python, else python3 (a GPU machine's own, with its CUDA build
# of torch). Where that Python cannot import graphamp, the package is staged in a temporary
# folder on PYTHONPATH: nothing is installed, nothing downloaded. It stops at once, saying what
# is missing, when torch sees no GPU. onnxruntime without its CUDA provider (the onnxruntime-gpu
# package) skips only the onnxruntime latency parts, and says so; a CUDA provider listed but not
# loaded (a CUDA or cuDNN library not found) is said too, and its latencies are refused rather
# than measured on the CPU provider onnxruntime falls back to.
#
# onnxruntime-gpu where the GPU machine's image lacks it and takes less than its wheel a transfer
# (the lent H200s: onnxruntime 1.30 without CUDA, 64 MiB a call; onnxruntime-gpu 1.31.1 is built
# for CUDA 13, as their torch 2.11+cu130 is, and its wheel is 255 MB): pack it here once,
#     python tools/gpu/wheel_parts.py pack onnxruntime_gpu-1.31.1-cp312-*.whl --into .ort-gpu \
#         --drop 'onnxruntime/capi/libonnxruntime_providers_tensorrt.so' \
#         --drop 'onnxruntime/capi/libonnxruntime.so*'
# (186 MiB in 4 parts of at most 56; .ort-gpu ignored by git), carry .ort-gpu/part-1, then
# part-2... one a call while the machine is warm (it keeps what earlier calls left), and in the
# last call run this script with ORT_GPU_PARTS=.ort-gpu: the parts are checked and unpacked into
# a temporary folder put first on PYTHONPATH (a missing or damaged part stops it, named, exit 2).
#
# First, tools/gpu/cuda_paths.py (about 20 s, outside the budget): the eager step's CUDA-only
# passes (the fused float16 softmax, the finite check read on the host once, the row-wise
# backwards written into their gradient) on a small BERT, against the same step without them.
#
# Issue 42's figures, each part under a deadline of its own so that every part gets its share
# of the budget (a configuration not started by its deadline is named as not measured); PARTS
# picks some of them (default "resnet50 bert-base curves infer"), the budget shared among those:
#   1. ResNet-50 (batch 128) training steps: float32 (TF32 off, and on), eager autocast +
#      GradScaler, torch.compile + autocast, graphamp's train_step eager and compiled
#      ($DTYPES, default float16);
#   2. the same for Hugging Face BERT-base (batch 32, sequence 512);
#   3. loss curves: 200 steps of autocast and of graphamp's step from 2 seeds (batch 32);
#   4. onnxruntime CUDA latency of BERT-base, GPT-2 with its cache, a LLaMA-shaped decoder and
#      ResNet-50 converted by graphamp and by onnxruntime's float16 tool (onnxruntime-gpu only).
# Results: Markdown on stdout and in OUT_DIR (default gpu-results/), JSON beside it, each table
# headed by the GPU, driver, CUDA, torch and onnxruntime versions; they go to BENCHMARKS.md by
# hand. On an H200 (2026-11-28, PROFILE=1) the ResNet-50 part took 196 s (its compilations),
# BERT-base 239 s, cuda_paths.py 20 s, and the curves take about 100 s: the two models fit one
# call (PROFILE=1 PARTS="resnet50 bert-base" BUDGET_S=480, about 8 minutes with a machine's
# start), the curves a second.
#
# PROFILE=1 adds torch.profiler tables wherever graphamp's step is slower than the baseline of
# its kind (eager autocast, compile + autocast): OUT_DIR/profile-<model>-<mode>.txt, the ops by
# self CUDA time for both (issue 42: a shortfall is explained by a profile). It costs each such
# pair six more steps; give the part more of the budget (PARTS=bert-base alone).
#
# On a machine without a GPU, GPU_CHECK_DRY_RUN=1 runs the same commands at tiny sizes on the CPU
# without torch.compile, and GPU_CHECK_DRY_RUN=parse gives each part a deadline already past, so
# it starts nothing: both check the script, not the speed (tests/tools/test_gpu_check.py).
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
if [ "${1:-}" = "--all" ]; then
    all=1
    shift
fi
out=${1:-gpu-results}
mkdir -p "$out"
budget=${BUDGET_S:-480}
dtypes=${DTYPES:-float16}
profile=()
case ${PROFILE:-0} in
    0) ;;
    1) profile=(--profile) ;;
    *)
        echo "gpu_check: PROFILE=${PROFILE}: expected 0 or 1" >&2
        exit 2
        ;;
esac
parts=${PARTS:-resnet50 bert-base curves infer}
for name in $parts; do
    case $name in
        resnet50 | bert-base | curves | infer) ;;
        *)
            echo "gpu_check: PARTS names '$name': expected resnet50, bert-base, curves, infer" >&2
            exit 2
            ;;
    esac
done
dry=${GPU_CHECK_DRY_RUN:-0}
start=$(date +%s)

py=${PYTHON:-}
if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
# -P: the current folder (this checkout, whose graphamp/ lacks passes/ and models/) is not put
# first on the module path
if ! "$py" -P -c "import graphamp.passes, graphamp.models" 2>/dev/null; then
    stage=$(mktemp -d)
    cp -r graphamp "$stage/graphamp"
    cp -r passes "$stage/graphamp/passes"
    cp -r models "$stage/graphamp/models"
    export PYTHONPATH="$stage${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
# onnxruntime-gpu carried in parts (tools/gpu/wheel_parts.py: a GPU image whose onnxruntime has
# no CUDA provider, a wheel larger than one transfer): ORT_GPU_PARTS names the folder of parts
if [ -n "${ORT_GPU_PARTS:-}" ]; then
    site=$(mktemp -d)
    "$py" -P tools/gpu/wheel_parts.py unpack "$ORT_GPU_PARTS" --into "$site" || exit 2
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi

# torch first: onnxruntime's CUDA provider then finds the CUDA and cuDNN libraries torch loaded
ort_cuda=$("$py" - "$dry" <<'PY'
import contextlib
import sys
import torch
import numpy
import onnx
import onnxruntime
if not torch.cuda.is_available() and sys.argv[1] not in ("1", "parse"):
    sys.exit("gpu_check: torch sees no CUDA device (a CUDA build of torch on a GPU machine)")
device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (dry run)"
cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
state = "with" if cuda else "without"
if cuda and torch.cuda.is_available():  # listed is not loaded: run one op on it
    h = onnx.helper
    x, y = (h.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [2]) for name in "xy")
    graph = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    # onnxruntime prints why a provider failed on stdout: to stderr, with this script's lines
    with contextlib.redirect_stdout(sys.stderr):
        try:
            session = onnxruntime.InferenceSession(
                model.SerializeToString(), providers=["CUDAExecutionProvider"]
            )
            session.run(None, {"x": numpy.array([-1.0, 2.0], dtype=numpy.float32)})
            cuda = session.get_providers()[0] == "CUDAExecutionProvider"
        except Exception as error:  # any failure of the provider: the latency parts are skipped
            print(f"gpu_check: onnxruntime's CUDA provider failed: {error}")
            cuda = False
    state = "with" if cuda else "its CUDA provider listed but not loaded: see above; without"
print(
    f"# device: {device} | torch {torch.__version__} | onnxruntime {onnxruntime.__version__}"
    f" at {onnxruntime.__file__.rsplit('/', 2)[0]} ({state} its CUDA provider)",
    file=sys.stderr,
)
print(int(cuda))
PY
)

# Runs one part of tools/gpu/bench_gpu.py, which starts nothing after the deadline it is given
# (seconds into the budget), and is stopped at the end of the whole budget.
part() {
    local until=$1
    shift
    local left=$((start + budget - $(date +%s)))
    if [ "$left" -le 0 ]; then
        echo "gpu_check: out of time before bench_gpu.py $*: not measured"
        return 0
    fi
    local extra=() deadline=$((start + until))
    if [ "$dry" != "0" ]; then extra=(--no-compile --steps 1 --warmup 1 --curve-steps 10); fi
    if [ "$dry" = "parse" ]; then deadline=0; fi
    timeout "$left" "$py" tools/gpu/bench_gpu.py "$@" --deadline "$deadline" --out "$out" \
        "${extra[@]}" ||
        echo "gpu_check: bench_gpu.py $* stopped (exit $?): its finished tables are in $out"
}

# Each selected part's share of the budget, in seconds (the weights: what each took on an H200).
declare -A weight=([resnet50]=30 [bert-base]=36 [curves]=22 [infer]=7)
total=0
for name in $parts; do total=$((total + weight[$name])); done
until=0
share() { until=$((until + budget * weight[$1] / total)); }
chosen() { [[ " $parts " == *" $1 "* ]]; }

if [ "$dry" = "0" ]; then
    # the eager step's CUDA-only passes against the same step without them (20 s on an H200)
    echo "## The eager step's CUDA-only passes, run (tools/gpu/cuda_paths.py)"
    timeout 120 "$py" tools/gpu/cuda_paths.py ||
        echo "gpu_check: cuda_paths.py: a CUDA pass did not run, or the values differ (above)"
fi
echo "## Issue 42: training speed-up over float32 and compile + autocast, loss curves"
for model in resnet50 bert-base; do
    if chosen $model; then
        share $model
        part $until --part train --models $model --dtypes $dtypes --steps 10 --warmup 3 \
            "${profile[@]}"
    fi
done
if chosen curves; then
    share curves
    part $until --part curves --models resnet50 --dtypes $dtypes --seeds 2 --curve-batch 32
fi
if chosen infer; then
    share infer
    if [ "$ort_cuda" = "1" ] || [ "$dry" != "0" ]; then
        echo "## Issue 42: onnxruntime CUDA latency against onnxruntime's float16 tool"
        part $until --part infer --infer-runs 50 --infer-warmup 10
    else
        echo "## onnxruntime has no CUDAExecutionProvider here (pip install onnxruntime-gpu):"
        echo "## the ONNX latency figures are not measured"
    fi
fi
echo "gpu_check: issue 42's parts took $(($(date +%s) - start)) s of a ${budget} s budget"

if [ "$all" = "1" ]; then
    echo "## The demo, verified natively on the GPU (float16 kernels, not emulation)"
    "$py" -P -m graphamp.cli demo --provider cuda
    echo "## Deployed graphs: Casts, error and onnxruntime CUDA latency per tool"
    "$py" tools/bench/bench_deploy.py --gpu --full --runs 1 --json "$out/deploy.json"
    echo "## The faithful evaluator against the GPU's float16 (planted faults; TF32 on and off)"
    "$py" tools/gpu/gpu_numerics.py
    echo "## Whole training steps on the GPU (float16, dynamic loss scaling)"
    "$py" tools/bench/bench_train.py --device cuda --width 4096 --batch 512
    echo "## ONNX conversion and onnxruntime latency (zoo, full size)"
    "$py" tools/bench/bench_onnx.py --size full --chain 0 --json "$out/onnx.json"
    echo "## Float8 (issue 41): float8 GEMMs and a LLaMA-3-8B block's training step against bfloat16 and torchao"
    "$py" tools/gpu/gpu_fp8.py --json "$out/fp8.json"
fi
