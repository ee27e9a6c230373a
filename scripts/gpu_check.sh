#!/usr/bin/env bash
# GPU checks in one command (about 10 minutes on one GPU). Every output goes under OUT_DIR.
#   bash scripts/gpu_check.sh OUT_DIR
# Each step has its own time limit; a failing step is recorded and the next one runs; steps
# that could pass the overall deadline (GPU_CHECK_SECONDS, default 590) are skipped.
set -u
out=${1:?usage: bash scripts/gpu_check.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
summary="$out/summary.txt"
deadline=${GPU_CHECK_SECONDS:-590}  # whole run; a step that could overrun it is skipped
: > "$summary"

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  local started=$SECONDS
  if (( SECONDS + limit > deadline )); then
    printf '%-26s skipped: would pass the %ds deadline\n' "$name" "$deadline" | tee -a "$summary"
    return
  fi
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  printf '%-26s exit %3d  %4ds  (%s)\n' "$name" "$rc" $((SECONDS - started)) "$*" | tee -a "$summary"
}

step nvidia-smi            20  nvidia-smi
# ---- issue 12: batch prediction at GPU scale (first, within its own ~8 minutes) ---------------------
# 2,048 synthetic series, Kronos-small, lookback 400, pred_len 120 (the window slides after 112 steps), bf16:
# exact refill and approximate shift, CUDA graphs on (default) and off, first call apart from the
# steady state, the KV-read floor measured in the same run (--breakdown), then cached vs full recompute.
i12="python -m kronos_core.bench predict --size small --series 2048 --lookback 400 --pred-len 120 --paths cached \
     --amp bf16 --max-batch-size 2048"
step i12-graphs-equal-eager  90  python -m pytest -m gpu -q -p no:cacheprovider tests/test_predictor.py
step i12-refill-graphs      110  $i12 --repeats 3 --breakdown
step i12-shift-graphs        80  $i12 --repeats 3 --breakdown --window-mode shift
step i12-refill-eager        80  $i12 --repeats 3 --cuda-graphs off
step i12-shift-eager         60  $i12 --repeats 3 --cuda-graphs off --window-mode shift
step i12-cached-vs-recompute 60  python -m kronos_core.bench predict --size small --series 256 --lookback 400 \
                                 --pred-len 30 --amp bf16 --repeats 3 --breakdown
# ---- end of issue 12 --------------------------------------------------------------------------------
step pytest-gpu           120  python -m pytest -m gpu -q -p no:cacheprovider
step memory-estimate       90  python scripts/gpu_memory_check.py --size small --batch 50 --modes fp32 bf16
step monitor-nvml          20  kronos-tune monitor --json --duration 3 --interval 0.5
step profile-mfu           60  kronos-tune profile --preset h200 --steps 3 --trace "$out/trace.json"
step train-precision      100  python -m kronos_core.bench_train --device cuda --mode precision --repeats 5
step autobatch-rtx3080     90  kronos-tune autobatch --preset rtx3080 --json
step autobatch-estimate    60  kronos-tune autobatch --preset rtx3080 --estimate --json
echo "outputs in $out" | tee -a "$summary"
