#!/usr/bin/env bash
# GPU checks in one command per section (each about 10 minutes on one GPU). Every output goes under OUT_DIR.
#   bash scripts/gpu_check.sh OUT_DIR [SECTION]      SECTION: i12 (default: batch prediction), i11 (benchmark
#                                                    decisions, watchdog, dashboard), rest (the older checks)
# On the device tool (8 files come back at most): bash scripts/gpu_check.sh /tmp/gc i11; tar czf $OUT/gc.tgz -C /tmp gc
# Each step has its own time limit; a failing step is recorded and the next one runs; steps
# that could pass the overall deadline (GPU_CHECK_SECONDS, default 590) are skipped.
set -u
out=${1:?usage: bash scripts/gpu_check.sh OUT_DIR [i12|i11|rest]}
section=${2:-i12}
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
if [[ $section == i11 ]]; then
# ---- issue 11: benchmark decisions on a real GPU (its own ~10 minutes) --------------------------------
# The GPU tests (indexed devices, budgets sized from the measured fixed cost, TF32 and CUDA-graph compile
# trials), the rtx3080 and h200 benchmarks with every trial under its watchdog (shortened measuring budget),
# the watchdog path on a trial that hangs ignoring SIGTERM, `report` over the new runs, and the dashboard
# driven headless with a screenshot of its GPU panel.
short="--trial-budget 5 --max-steps 30 --trial-timeout 150"
step i11-pytest-gpu         90  python -m pytest -m gpu -q -p no:cacheprovider tests/test_memory.py \
                                tests/test_autobatch.py tests/test_benchmark_gpu.py
step i11-rtx3080           220  kronos-tune benchmark --preset rtx3080 --out "$out/i11-rtx3080" $short
step i11-h200              150  kronos-tune benchmark --preset h200 --out "$out/i11-h200" $short \
                                --skip compile,compile-cudagraphs,autobatch
step i11-watchdog           60  env KRONOS_TUNE_FAULT=hang:fused-adamw kronos-tune benchmark --preset rtx3080 \
                                --only fused-adamw --skip noise-probe,baseline-repeat --trial-timeout 20 \
                                --trial-budget 3 --out "$out/i11-watchdog"
# issue 16: the h200 run above includes the bigger-batch trial (its MFU column is the MFU at the maximized batch)
step i16-maximize           40  kronos-tune autobatch --preset h200 --maximize --json
step i11-report             20  kronos-tune report "$out/i11-rtx3080" "$out/i11-h200" "$out/i11-watchdog"
step i11-dashboard          30  python scripts/dashboard_snapshot.py "$out" --preset h200 --seconds 4
echo "outputs in $out" | tee -a "$summary"
exit 0
fi
if [[ $section == i12 ]]; then
# ---- issue 12: batch prediction at GPU scale (first, within its own ~8 minutes) ---------------------
# 2,048 synthetic series, Kronos-small, lookback 400, pred_len 120 (the window slides after 112 steps), bf16:
# exact refill and approximate shift, CUDA graphs on (default) and off, first call apart from the
# steady state, the KV-read floor measured in the same run (--breakdown), then cached vs full recompute.
i12="python -m benchmarks.predict --size small --series 2048 --lookback 400 --pred-len 120 --paths cached \
     --amp bf16 --max-batch-size 2048"
step i12-graphs-equal-eager  90  python -m pytest -m gpu -q -p no:cacheprovider tests/test_predictor.py
step i12-refill-graphs      110  $i12 --repeats 3 --breakdown
step i12-shift-graphs        80  $i12 --repeats 3 --breakdown --window-mode shift
step i12-refill-eager        80  $i12 --repeats 3 --cuda-graphs off
step i12-shift-eager         60  $i12 --repeats 3 --cuda-graphs off --window-mode shift
step i12-cached-vs-recompute 60  python -m benchmarks.predict --size small --series 256 --lookback 400 \
                                 --pred-len 30 --amp bf16 --repeats 3 --breakdown
# ---- end of issue 12 --------------------------------------------------------------------------------
echo "outputs in $out" | tee -a "$summary"
exit 0
fi
step pytest-gpu           120  python -m pytest -m gpu -q -p no:cacheprovider
step memory-estimate       90  python scripts/gpu_memory_check.py --size small --batch 50 --modes fp32 bf16
step monitor-nvml          20  kronos-tune monitor --json --duration 3 --interval 0.5
step profile-mfu           60  kronos-tune profile --preset h200 --steps 3 --trace "$out/trace.json"
step train-precision      100  python -m benchmarks.train --device cuda --mode precision --repeats 5
step autobatch-rtx3080     90  kronos-tune autobatch --preset rtx3080 --json
step autobatch-estimate    60  kronos-tune autobatch --preset rtx3080 --estimate --json
echo "outputs in $out" | tee -a "$summary"
