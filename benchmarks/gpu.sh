#!/usr/bin/env bash
# The GPU measurements of issues 23 and 24 in one command, on a machine with a CUDA GPU and PyTorch:
#
#     bash benchmarks/gpu.sh [OUT_DIR]        (default benchmarks/results/gpu; PYTHON picks the interpreter)
#
# 1. A GPU-sized transformer block (examples/make_examples.py --transformer 8,1024,1024,16: batch 8, sequence
#    1024, hidden 1024, 16 heads, float32) profiled on the GPU: per op and per plan, predicted vs measured
#    (python -m benchmarks.costs, on 1 and 4 devices' local shapes). Forward in onnxruntime where it has CUDA,
#    else in PyTorch (benchmarks.costs --framework auto says which).
# 2. Its one-device training plan trained on the GPU (`unity-eq train --device cuda`, NCCL, one rank), twice:
#    planned with the datasheet machine (examples/machines/h200.toml) and with the measured table
#    (`optimize --profile`); each run prints the measured step time beside the plan's prediction.
# 3. The test suite's CUDA tests (they skip without CUDA; here they run).
# Every step's output goes to OUT_DIR/gpu.log; a failing step is reported and the next one runs.
set -uo pipefail
OUT=${1:-benchmarks/results/gpu}
SIZE=${SIZE:-8,1024,1024,16}  # B,S,H,HEADS of the block; a small SIZE makes a quick dry run on the CPU
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
ue() { "$PY" -m unity_eq "$@"; }
trainrun() { "$PY" -m torch.distributed.run --nproc_per_node 1 -m unity_eq train "$@"; }

: > "$LOG"
step "device" nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
step "model" "$PY" examples/make_examples.py --transformer "$SIZE" --out "$MODEL"
step "costs, 1 device" "$PY" -m benchmarks.costs --device cuda --model "$MODEL" --devices 1 --out "$OUT/costs-1"
step "costs, 4 devices' shapes" "$PY" -m benchmarks.costs --device cuda --model "$MODEL" --devices 4 \
    --out "$OUT/costs-4"
step "plan (datasheet machine)" ue optimize "$MODEL" --machine examples/machines/h200.toml --objective training \
    -o "$WORK/plan-sheet" -q
step "train (datasheet plan)" trainrun "$WORK/plan-sheet" --steps 20 --loss mean --device cuda
if [ -f "$OUT/costs-1.profile.json" ]; then
    step "plan (measured table)" ue optimize "$MODEL" --machine examples/machines/h200.toml --objective training \
        --profile "$OUT/costs-1.profile.json" -o "$WORK/plan-measured" -q
    step "train (measured plan)" trainrun "$WORK/plan-measured" --steps 20 --loss mean --device cuda
fi
step "CUDA tests" "$PY" -m pytest -p no:cacheprovider -o addopts="" -q -rs \
    tests/test_profile.py tests/test_train.py -k "cuda"
echo "== done in ${SECONDS} s; failed=$failed" | tee -a "$LOG"
exit $failed
