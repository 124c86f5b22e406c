#!/usr/bin/env bash
# The GPU measurements of issues 23 and 24 in one command, on a machine with a CUDA GPU and PyTorch:
#
#     bash benchmarks/gpu.sh [OUT_DIR]        (default benchmarks/results/gpu; PYTHON picks the interpreter)
#
# Steps (STEPS="costs costs-bf16 train plans tests" by default; name fewer to run fewer):
#   costs       a GPU-sized transformer block (examples/make_examples.py --transformer $SIZE: batch 8, sequence
#               1024, hidden 1024, 16 heads), float32, profiled on the GPU: per op and per plan, predicted vs
#               measured (python -m benchmarks.costs; forward in onnxruntime where it has CUDA, else PyTorch);
#   costs-bf16  the same block in bfloat16, on the local shapes of 1 device;
#   costs-4     the float32 block on the local shapes of 4 devices;
#   train       its one-device training plan trained on the GPU (`unity-eq train --device cuda`, NCCL, one rank),
#               planned with the datasheet machine (benchmarks/machines/h200.toml) and with the measured table;
#   plans       whole one-device plans of several blocks (float32, bfloat16) run on the GPU against their
#               prediction, inference and training (python -m benchmarks.gpu_plans);
#   tests       the test suite's CUDA tests (they skip without CUDA; here they run).
# Every step's output goes to OUT_DIR/gpu.log; a failing step is reported and the next one runs.
set -uo pipefail
OUT=${1:-benchmarks/results/gpu}
SIZE=${SIZE:-8,1024,1024,16}  # B,S,H,HEADS of the block; a small SIZE makes a quick dry run on the CPU
STEPS=${STEPS:-costs costs-bf16 train plans tests}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
LOG="$OUT/gpu.log"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
MODEL="$WORK/block.onnx"
failed=0
step() {
    echo "== $1 (at ${SECONDS} s)" | tee -a "$LOG"
    shift
    "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || { echo "!! exit $rc" | tee -a "$LOG"; failed=1; }
}
wants() { [[ " $STEPS " == *" $1 "* ]]; }
ue() { "$PY" -m unity_eq "$@"; }
trainrun() { "$PY" -m torch.distributed.run --nproc_per_node 1 -m unity_eq train "$@"; }
costs() {  # NAME MODEL DEVICES: the tables in $OUT, the measured profile (large) in $WORK
    "$PY" -m benchmarks.costs --device cuda --model "$2" --devices "$3" --out "$WORK/$1" \
        && cp "$WORK/$1.json" "$WORK/$1.md" "$OUT/"
}

: > "$LOG"
step "device" nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
step "model" "$PY" examples/make_examples.py --transformer "$SIZE" --out "$MODEL"
wants costs && step "costs, 1 device" costs costs-1 "$MODEL" 1
if wants costs-bf16; then
    step "model, bfloat16" "$PY" examples/make_examples.py --transformer "$SIZE" --dtype bfloat16 \
        --out "$WORK/block-bf16.onnx"
    step "costs, bfloat16, 1 device" costs costs-1-bf16 "$WORK/block-bf16.onnx" 1
fi
wants costs-4 && step "costs, 4 devices' shapes" costs costs-4 "$MODEL" 4
if wants train; then
    step "plan (datasheet machine)" ue optimize "$MODEL" --machine benchmarks/machines/h200.toml \
        --objective training -o "$WORK/plan-sheet" -q
    step "train (datasheet plan)" trainrun "$WORK/plan-sheet" --steps 20 --loss mean --device cuda
    if [ -f "$WORK/costs-1.profile.json" ]; then
        step "plan (measured table)" ue optimize "$MODEL" --machine benchmarks/machines/h200.toml \
            --objective training --profile "$WORK/costs-1.profile.json" -o "$WORK/plan-measured" -q
        step "train (measured plan)" trainrun "$WORK/plan-measured" --steps 20 --loss mean --device cuda
    fi
fi
wants plans && step "whole plans on the GPU" "$PY" -m benchmarks.gpu_plans --out "$OUT/plans"
wants tests && step "CUDA tests" "$PY" -m pytest -p no:cacheprovider -o addopts="" -q -rs \
    tests/test_profile.py tests/test_train.py -k "cuda"
echo "== done in ${SECONDS} s; failed=$failed" | tee -a "$LOG"
exit $failed
