"""`kronos-tune predict` over a real panel, end to end, in one process and sharded: series/s and identical output.

    python scripts/bench_panel_predict.py ../shared/data/sp500_daily.csv --symbol-column Symbol
    python scripts/bench_panel_predict.py PANEL --symbol-column Symbol --size tiny --repeats 1   # a quick try

Runs the real command line (`kronos-tune predict --data PANEL --symbol-column ... --skip-short`, random
weights of --size, greedy) 1 + --repeats times in one process and as many times with --nproc N (torchrun,
gloo). Every symbol with at least --lookback rows is predicted; the rest are skipped (--skip-short).
Each call is timed from the outside (interpreter start to exit: reading the file, building the model,
predicting, writing the parquet). The first call of each mode is reported apart (cold file cache and
imports); the others give the median series/s with its min-max. Every output is compared bit for bit with
the first one-process output: the sharded runs split the series into N contiguous blocks, so the batch size
(--max-batch-size, default the first block's size) is chosen so that one process runs the very same batches
(CPU matmuls round differently for other batch compositions).

Outputs go to a new folder (kept with --keep, else removed). Timings taken on a busy machine mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from kronos_core.data.kline import FEATURE_COLUMNS
from kronos_core.data.panels import read_panel
from kronos_core.predict.sharded import shard_bounds


def usable_series(panel: Path, symbol_column: str, lookback: int) -> int:
    counts = read_panel(panel, symbol_column).groupby("symbol", sort=False).size()
    return int((counts >= lookback).sum())


def aligned_batch(series: int, nproc: int) -> int:
    """The largest batch size whose batches in one process are exactly the ranks' batches: every block
    must start on a batch boundary."""
    starts = [begin for begin, _ in shard_bounds(series, nproc)[1:]]
    return math.gcd(*starts) if starts else series


def predict_command(args: argparse.Namespace, batch: int, out: Path, nproc: int) -> list[str]:
    command = [sys.executable, "-m", "kronos_tune.cli", "predict", "--size", args.size, "--device", "cpu",
               "--lookback", str(args.lookback), "--pred-len", str(args.pred_len), "--data", str(args.panel),
               "--symbol-column", args.symbol_column, "--skip-short", "--top-k", "1", "--seed", "0",
               "--max-batch-size", str(batch), "--out", str(out), "--json"]
    return command + (["--nproc", str(nproc)] if nproc > 1 else [])


def run_once(command: list[str]) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} exited with {done.returncode}: {done.stderr.strip()[-600:]}")
    return wall, json.loads(done.stdout)


def same_output(a: Path, b: Path) -> bool:
    left, right = pd.read_parquet(a), pd.read_parquet(b)
    return (list(left["series"]) == list(right["series"]) and list(left["timestamps"]) == list(right["timestamps"])
            and np.array_equal(left[list(FEATURE_COLUMNS)].to_numpy(), right[list(FEATURE_COLUMNS)].to_numpy()))


def measure(args: argparse.Namespace, batch: int, nproc: int, work: Path, reference: Path | None) -> dict:
    runs = []
    for index in range(1 + args.repeats):
        out = work / f"nproc{nproc}-{index}.parquet"
        wall, report = run_once(predict_command(args, batch, out, nproc))
        runs.append({"wall_s": wall, "series": report["series"], "predict_s": report["predict_seconds"],
                     "out": out})
        print(f"  nproc {nproc} call {index + 1}: {wall:.1f} s end to end ({report['series'] / wall:.1f} series/s), "
              f"predict {report['predict_seconds']:.1f} s", flush=True)
    reference = reference or runs[0]["out"]
    identical = all(same_output(reference, run["out"]) for run in runs)
    timed = runs[1:] or runs
    rates = [run["series"] / run["wall_s"] for run in timed]
    return {"nproc": nproc, "series": runs[0]["series"], "first_wall_s": runs[0]["wall_s"],
            "first_series_per_s": runs[0]["series"] / runs[0]["wall_s"],
            "median_wall_s": statistics.median(run["wall_s"] for run in timed),
            "median_series_per_s": statistics.median(rates), "min_series_per_s": min(rates),
            "max_series_per_s": max(rates), "median_predict_s": statistics.median(run["predict_s"] for run in timed),
            "repeats": len(timed), "identical_to_one_process": identical, "reference": reference}


def line(result: dict) -> str:
    return (f"nproc {result['nproc']}: {result['series']} series; first call {result['first_wall_s']:.1f} s "
            f"({result['first_series_per_s']:.1f} series/s); then median {result['median_series_per_s']:.1f} "
            f"series/s (min {result['min_series_per_s']:.1f}, max {result['max_series_per_s']:.1f}, "
            f"{result['repeats']} calls; median wall {result['median_wall_s']:.1f} s, predict "
            f"{result['median_predict_s']:.1f} s); output identical to one process: "
            f"{'yes' if result['identical_to_one_process'] else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("panel", type=Path)
    parser.add_argument("--symbol-column", required=True)
    parser.add_argument("--size", default="mini")
    parser.add_argument("--lookback", type=int, default=200)
    parser.add_argument("--pred-len", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per mode after the first")
    parser.add_argument("--nproc", type=int, default=2, help="processes of the sharded mode")
    parser.add_argument("--max-batch-size", type=int, default=None,
                        help="default: the largest size whose batches are the same in both modes")
    parser.add_argument("--keep", action="store_true", help="keep the outputs (their folder is printed)")
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON object")
    args = parser.parse_args(argv)

    series = usable_series(args.panel, args.symbol_column, args.lookback)
    batch = args.max_batch_size or aligned_batch(series, args.nproc)
    work = Path(tempfile.mkdtemp(prefix="kronos-bench-panel-"))
    threads = os.environ.get("OMP_NUM_THREADS", "torch's default")
    print(f"{args.panel}: {series} symbols with >= {args.lookback} rows; Kronos-{args.size} random weights, "
          f"lookback {args.lookback}, pred_len {args.pred_len}, greedy, --max-batch-size {batch}; one process: "
          f"intra-op threads {threads}, --nproc {args.nproc}: torchrun's per rank; outputs in {work}", flush=True)
    try:
        one = measure(args, batch, 1, work, None)
        sharded = measure(args, batch, args.nproc, work, one["reference"])
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(line(one))
    print(line(sharded))
    ratio = sharded["median_wall_s"] / one["median_wall_s"]
    print(f"wall time --nproc {args.nproc} / one process: {ratio:.2f} (median of {sharded['repeats']} vs "
          f"{one['repeats']} calls; series/s ratio {sharded['median_series_per_s'] / one['median_series_per_s']:.2f})")
    if args.json:
        for result in (one, sharded):
            result.pop("reference")
        print(json.dumps({"one_process": one, "sharded": sharded, "wall_ratio": ratio}))
    return 0 if one["identical_to_one_process"] and sharded["identical_to_one_process"] else 1


if __name__ == "__main__":
    sys.exit(main())
