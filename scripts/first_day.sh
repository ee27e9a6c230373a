#!/usr/bin/env bash
# A new user's first day, as a script (not part of the test suite; it runs real commands for minutes):
# the README's quick start and the S&P 500 commands of docs/data.md and docs/train.md, every output
# redirected to a file the way a user pipes it, then three checks over the outputs:
#   cut cells        a '…' anywhere (nothing is cut when stdout is not a terminal)
#   progress         a 'N/M' count past its end (N > M) on a progress or step line
#   marks            report.json: each trial's shown step time and its delta agree in sign
#
#   bash scripts/first_day.sh [WORK_DIR]     (default: a new temporary folder; S&P commands need
#                                             SP500_CSV or /work/shared/data/sp500_daily.csv)
# Exit 0 when every check passes; each failure is one line naming the output file.
set -u
work=${1:-$(mktemp -d -t kronos-first-day-XXXX)}
sp500=${SP500_CSV:-/work/shared/data/sp500_daily.csv}
mkdir -p "$work"
unset COLUMNS  # as a pipe or a file sees it
cd "$work" || exit 2
echo "first day in $work"
failed=0

run() {  # run NAME COMMAND...: stdout and stderr to NAME.out, the exit code noted
    local name=$1
    shift
    echo "+ $*" > "$name.out"
    "$@" >> "$name.out" 2>&1
    local code=$?
    [ $code -eq 0 ] || { echo "FAIL $name: exit $code (see $work/$name.out)"; failed=1; }
}

# The README's quick start.
run bench kronos-tune benchmark --preset cpu --out bench
run keys kronos-tune config keys
run train_rec kronos-tune train --config bench/recommended.toml --steps 3 --out train_rec
run predict kronos-tune predict --size small --synthetic 8 --lookback 400 --pred-len 30
run backtest kronos-tune backtest --size mini --synthetic 300 --lookback 256 --pred-len 12 --out backtest
run report kronos-tune report bench

# The S&P 500 panel (docs/data.md, docs/train.md).
if [ -f "$sp500" ]; then
    cp "$sp500" sp500_daily.csv
    run sp_predict kronos-tune predict --size mini --data sp500_daily.csv --symbol-column Symbol --skip-short \
        --lookback 200 --pred-len 5 --out pred.parquet
    run sp_backtest kronos-tune backtest --size mini --data sp500_daily.csv --symbol-column Symbol \
        --lookback 200 --pred-len 5 --origins 8 --every 5 --out sp_backtest
    # docs/backtest.md's finetune, then the out-of-sample comparison (its mini.toml, as the page shows it)
    printf '%s\n' 'model_size = "mini"' 'lookback_window = 60' 'predict_window = 5' 'batch_size = 16' \
        'samples_per_epoch = 1600' 'epochs = 1' > mini.toml
    run sp_train kronos-tune train --config mini.toml --data sp500_daily.csv --symbol-column Symbol \
        --train-until 2010-05-18 --steps 20 --out sp_train
    run sp_compare kronos-tune backtest --size mini --seed 100 --data sp500_daily.csv --symbol-column Symbol \
        --lookback 60 --pred-len 5 --every 5 --origins 12 --compare checkpoint=sp_train --out sp_compare
    # the cpu preset's window (101 rows) cannot split a series cut at 2010-05-18 (180 rows): one line, exit 2
    if kronos-tune train --preset cpu --data sp500_daily.csv --symbol-column Symbol --train-until 2010-05-18 \
        --steps 2 --out sp_train_cpu > sp_train_cpu.out 2>&1; then
        echo "FAIL sp_train_cpu: trained with a split that holds no validation window"; failed=1
    elif [ "$(grep -c . sp_train_cpu.out)" -ne 1 ] || [ -e sp_train_cpu ]; then
        echo "FAIL sp_train_cpu: not one line, or a run folder left (see $work/sp_train_cpu.out)"; failed=1
    fi
else
    echo "skip S&P 500 commands: no $sp500 (set SP500_CSV)"
fi

# Checks.
shopt -s nullglob
for file in *.out; do
    if grep -q '…' "$file"; then
        echo "FAIL cut cells in $file:"; grep -n '…' "$file" | head -3; failed=1
    fi
    if ! python - "$file" <<'EOF'
import re, sys
path = sys.argv[1]
bad = [line for line in open(path, encoding="utf-8", errors="replace")
       if re.search(r"━|step|trial", line)
       and any(int(a) > int(b) > 0 for a, b in re.findall(r"\b(\d+)/(\d+)\b", line))]
for line in bad[:3]:
    print(f"FAIL progress past its end in {path}: {line.strip()}")
sys.exit(1 if bad else 0)
EOF
    then failed=1; fi
done
if [ -f bench/report.json ] && ! python - bench/report.json <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
shown = report.get("shown", {}).get("trials", {})
base = next((t for t in report["trials"] if t.get("kind") == "reference"), None)
bad = []
for trial in report["trials"]:
    if base is None or trial["name"] == base["name"] or trial["status"] != "ok":
        continue
    mine, theirs = shown.get(trial["name"], {}).get("shown"), shown.get(base["name"], {}).get("shown")
    for key in ("step_time_s",):  # the full run may differ in sign: it adds one-time costs (compile)
        delta = (trial.get("deltas") or {}).get(key)
        if mine is None or theirs is None or delta is None or abs(delta["pct"]) < 0.05:
            continue
        if (mine - theirs) * delta["pct"] < 0:
            bad.append(f"{trial['name']}: shown {mine:.4g} s vs baseline {theirs:.4g} s, {key} delta {delta['pct']:+.1f}%")
for line in bad:
    print(f"FAIL contradicting marks in {sys.argv[1]}: {line}")
sys.exit(1 if bad else 0)
EOF
then failed=1; fi
[ $failed -eq 0 ] && echo "first day: every check passed ($work)"
exit $failed
