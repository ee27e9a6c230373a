#!/usr/bin/env bash
# The quick start's install, proved: a fresh virtual environment with torch and `pip install -e .` (no
# extras), then the README's commands at small sizes. Each must exit 0 and print no traceback; a missing
# package shows up here as it would for a new user (the dev install of .ci/run has every extra).
#
#   bash scripts/base_install_check.sh [WORK_DIR]   (default: a new temporary folder; the venv goes in it)
#
# Set BASE_VENV to an existing environment to skip the install (a rerun of the commands only).
# Exit 0 when every command passes; each failure is one line naming its output file.
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d -t kronos-base-install-XXXX)}
mkdir -p "$work"
work=$(cd "$work" && pwd)
echo "base install check in $work"

venv=${BASE_VENV:-$work/venv}
if [ -z "${BASE_VENV:-}" ]; then
    python3 -m venv "$venv" || exit 1
    "$venv/bin/pip" install -q torch==2.13.0 || exit 1
    "$venv/bin/pip" install -q -e "$repo" || exit 1
fi
source "$venv/bin/activate"
unset PYTHONPATH  # the installed package, as a new user has it
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} COLUMNS=120 HF_HUB_OFFLINE=1
cd "$work" || exit 1
rm -rf bench train predict.csv data.csv backtest ./*.out  # a rerun's (BASE_VENV) earlier outputs
failed=0

run() {  # run NAME COMMAND...: stdout and stderr to NAME.out; a non-zero exit or a traceback fails it
    local name=$1
    shift
    echo "+ $*" > "$name.out"
    "$@" >> "$name.out" 2>&1
    local code=$?
    if [ $code -ne 0 ]; then
        echo "FAIL $name: exit $code (see $work/$name.out)"; failed=1
    elif grep -q "Traceback" "$name.out"; then
        echo "FAIL $name: a traceback (see $work/$name.out)"; failed=1
    else
        echo "ok   $name"
    fi
}

# benchmark --preset cpu, shortened: the baseline and one trial, two measured steps each, timed one after the
# other (no A/A probe, no baseline re-measurement: those are what take the quick run its minutes)
run benchmark kronos-tune benchmark --preset cpu --only fused-adamw --skip noise-probe,baseline-repeat \
    --steps 1 --max-steps 2 --warmup 0 --trial-budget 1 --design sequential --out bench
printf '%s\n' 'model_size = "tiny"' 'lookback_window = 16' 'predict_window = 4' 'batch_size = 8' \
    'samples_per_epoch = 64' 'epochs = 1' 'eval_samples = 16' 'synthetic_series = 2' 'synthetic_rows = 200' \
    > tiny.toml
run train kronos-tune train --config tiny.toml --steps 2 --out train
run predict kronos-tune predict --size mini --synthetic 2 --lookback 64 --pred-len 4 --out predict.csv
python -c "from kronos_core.data.synthetic import synthetic_kline; synthetic_kline(300, seed=1).to_csv('data.csv', index=False)"
run predict_data kronos-tune predict --size mini --data data.csv --lookback 64 --pred-len 4
run backtest kronos-tune backtest --size mini --synthetic 12 --lookback 64 --pred-len 4 --origins 4 --top-k 3 \
    --out backtest
run report kronos-tune report bench

exit $failed
