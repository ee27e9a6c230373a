"""The backtest as a prediction job: memory in symbols x origins, kill -9 + --resume, ranks, its rate.

    python -m benchmarks.backtest_job rss --symbols 500 5000
    python -m benchmarks.backtest_job rss --data --symbols 400 4000 --origins 5
    python -m benchmarks.backtest_job resume --symbols 5000
    python -m benchmarks.backtest_job ranks --symbols 1000
    python -m benchmarks.backtest_job rate --symbols 1000 --repeats 3
    python -m benchmarks.backtest_job slow --symbols 1000 --slow 3

The real command line on a synthetic universe (`--synthetic N`), Kronos-tiny random weights on the CPU,
lookback 64, pred-len 4, --origins 40 (change with --origins), one command at a time:

- rss: the kernel's ru_maxrss of the whole command per universe size (wait4, as /usr/bin/time -v) and the
  ratio to the smallest size. Not a timing. With --data: on a Parquet panel sorted by symbol that it writes
  (N symbols x --bars daily bars), read in symbol batches, and the ratio to --synthetic of the same shape:
  `rss --data --symbols 400 4000 --origins 5` (400 bars, an origin every 83).
- resume: a full run; a run killed with SIGKILL once half its chunks are finished; --resume of it; the
  resumed part's wall against the full run's, and whether backtest.json and origins.csv are byte-identical.
- ranks: one process against --nproc 2 (gloo ranks claiming chunks): wall of each and whether the outputs
  are byte-identical.
- slow: --nproc 2 with rank 1 made --slow times slower (`benchmarks.planted_ranks`, KRONOS_BENCH_SLOW_RANK):
  the prediction's wall against the ideal (all symbol-origins at the ranks' combined speed, each rank's speed
  from its own chunks in run.json's `ranks_a`), and the chunks each rank took.
- rate: symbol-origins/s of the backtest (its own predict seconds) against series/s of `kronos-tune predict
  --out` on a panel of the same shape (N symbols x the same history, one window each), interleaved, over
  --repeats: the median of each and of the per-pair ratio, with min and max.

Timings taken on a busy machine mean nothing: the load average is printed with each result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.predict_job_runs import Measured, predict_command, run_measured, write_panel

LOOKBACK, PRED_LEN = 64, 4


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} / {five:.2f}"


def backtest_command(out: Path, symbols: int, origins: int, *extra: str, data: Path | None = None) -> list[str]:
    universe = ["--synthetic", str(symbols)] if data is None else ["--data", str(data)]
    return [sys.executable, "-m", "kronos_tune.cli", "backtest", "--size", "tiny", "--device", "cpu",
            "--lookback", str(LOOKBACK), "--pred-len", str(PRED_LEN), *universe, "--origins", str(origins),
            "--top-k", "10", "--out", str(out), "--json", *extra]


def checked(measured: Measured, what: str) -> dict:
    if measured.returncode != 0:
        raise SystemExit(f"{what} failed ({measured.returncode}): {measured.stderr.strip()[-800:]}")
    return json.loads(measured.stdout)


def outputs(run: Path) -> bytes:
    return (run / "backtest.json").read_bytes() + (run / "origins.csv").read_bytes()


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3g} (min {min(values):.3g}, max {max(values):.3g}, n={len(values)})"


def mode_rss(args: argparse.Namespace, work: Path) -> None:
    if args.data:
        rss_file_panels(args, work)
        return
    first = None
    for symbols in args.symbols:
        measured = run_measured(backtest_command(work / f"rss-{symbols}", symbols, args.origins))
        checked(measured, f"{symbols} symbols")
        first = first or measured.max_rss_bytes
        print(f"{symbols:,} symbols x {args.origins} origins: peak RSS {measured.max_rss_bytes / 2**20:,.0f} MiB "
              f"(x{measured.max_rss_bytes / first:.2f} of the first size), wall {measured.wall_s:.1f} s ({load()})")


def rss_file_panels(args: argparse.Namespace, work: Path) -> None:
    """Per size: the backtest on a sorted Parquet panel it writes, then on --synthetic of the same shape (the
    same bars per symbol: --every is chosen so the synthetic universe holds --bars, rounded to whole origins)."""
    every = max(1, (args.bars - LOOKBACK - PRED_LEN) // max(1, args.origins - 1))
    bars = LOOKBACK + PRED_LEN + (args.origins - 1) * every
    first = None
    for symbols in args.symbols:
        panel = write_panel(work / f"panel-{symbols}.parquet", symbols, rows=bars)
        shape = (args.origins, "--every", str(every))
        from_file = run_measured(backtest_command(work / f"file-{symbols}", symbols, *shape, data=panel))
        checked(from_file, f"{symbols} symbols from the panel file")
        panel.unlink()
        synthetic = run_measured(backtest_command(work / f"synthetic-{symbols}", symbols, *shape))
        checked(synthetic, f"{symbols} synthetic symbols")
        first = first or from_file.max_rss_bytes
        print(f"{symbols:,} symbols x {bars} bars, {args.origins} origins every {every} bars: panel file peak RSS "
              f"{from_file.max_rss_bytes / 2**20:,.0f} MiB (x{from_file.max_rss_bytes / first:.2f} of the first "
              f"size, target <= 1.25), --synthetic {synthetic.max_rss_bytes / 2**20:,.0f} MiB (file / synthetic "
              f"x{from_file.max_rss_bytes / synthetic.max_rss_bytes:.2f}, target <= 1.1) ({load()})")


def mode_resume(args: argparse.Namespace, work: Path) -> None:
    symbols = args.symbols[0]
    full = run_measured(backtest_command(work / "full", symbols, args.origins))
    checked(full, "full run")
    done = work / "cut" / "predictions" / "a.work" / "done"
    chunks = -(-symbols * args.origins // _chunk_size(full.stderr))

    def kill_at_half(process) -> None:
        if done.is_dir() and len(list(done.glob("*.json"))) >= chunks / 2:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    killed = run_measured(backtest_command(work / "cut", symbols, args.origins), on_poll=kill_at_half)
    kept = len(list(done.glob("*.json")))
    resumed = run_measured(backtest_command(work / "cut", symbols, args.origins, "--resume"))
    checked(resumed, "resume")
    identical = outputs(work / "cut") == outputs(work / "full")
    print(f"{symbols:,} symbols x {args.origins} origins, {chunks} chunks: full run {full.wall_s:.1f} s; killed "
          f"(code {killed.returncode}) with {kept} chunks finished; resumed part {resumed.wall_s:.1f} s = "
          f"{resumed.wall_s / full.wall_s:.2f} of the full run (target <= 0.6); backtest.json and origins.csv "
          f"byte-identical: {'yes' if identical else 'NO'} ({load()})")


def _chunk_size(stderr: str) -> int:
    for line in stderr.splitlines():
        if "chunks of " in line:
            return int(line.split("chunks of ")[1].split()[0])
    raise SystemExit("the run did not say its chunk size")


def mode_ranks(args: argparse.Namespace, work: Path) -> None:
    symbols = args.symbols[0]
    one = run_measured(backtest_command(work / "one", symbols, args.origins))
    checked(one, "one process")
    two = run_measured(backtest_command(work / "two", symbols, args.origins, "--nproc", "2"))
    checked(two, "--nproc 2")
    same = outputs(work / "one") == outputs(work / "two")
    print(f"{symbols:,} symbols x {args.origins} origins: one process {one.wall_s:.1f} s, --nproc 2 "
          f"{two.wall_s:.1f} s; outputs byte-identical: {'yes' if same else 'NO'} ({load()})")


def mode_slow(args: argparse.Namespace, work: Path) -> None:
    symbols = args.symbols[0]
    command = backtest_command(work / "slow", symbols, args.origins, "--nproc", "2")
    command[1:3] = ["-m", "benchmarks.planted_ranks"]  # the CLI, its ranks started with the planted slowdown
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "KRONOS_BENCH_SLOW_RANK": f"1:{args.slow:g}",
           "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    checked(run_measured(command, env=env), "--nproc 2 with a slow rank")
    state = json.loads((work / "slow" / "run.json").read_text())
    ranks = state["ranks_a"]
    combined = sum(r["series"] / r["seconds"] for r in ranks.values() if r["seconds"] > 0)
    ideal = symbols * args.origins / combined
    wall = state["session_predict_seconds"]
    taken = ", ".join(f"rank {rank}: {r['chunks']} chunks, {r['series'] / r['seconds']:.0f}/s"
                      for rank, r in ranks.items())
    print(f"{symbols:,} symbols x {args.origins} origins, rank 1 {args.slow:g}x slower: prediction {wall:.1f} s, "
          f"ideal {ideal:.1f} s, ratio {wall / ideal:.2f} (target <= 1.2); {taken} ({load()})")


def mode_rate(args: argparse.Namespace, work: Path) -> None:
    symbols = args.symbols[0]
    panel = write_panel(work / "panel.parquet", symbols, rows=64 + 4)
    backtest, predict, ratios = [], [], []
    for repeat in range(args.repeats):
        run = work / f"rate-{repeat}"
        measured = run_measured(backtest_command(run, symbols, args.origins))
        checked(measured, "backtest")
        state = json.loads((run / "run.json").read_text())
        backtest.append(state["symbol_origins_per_s"])
        report = checked(run_measured(predict_command(panel, work / f"p-{repeat}.parquet")), "predict")
        predict.append(report["series_per_s"])
        ratios.append(backtest[-1] / predict[-1])
    print(f"{symbols:,} symbols x {args.origins} origins: backtest symbol-origins/s {spread(backtest)}; predict --out "
          f"series/s on {symbols:,} series of the same shape {spread(predict)}; ratio {spread(ratios)} "
          f"(target >= 0.9) ({load()})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("rss", "resume", "ranks", "rate", "slow"))
    parser.add_argument("--slow", type=float, default=3.0, help="slow mode: rank 1's slowdown factor")
    parser.add_argument("--symbols", type=int, nargs="+", default=[500, 5000])
    parser.add_argument("--origins", type=int, default=40)
    parser.add_argument("--data", action="store_true",
                        help="rss mode: sorted Parquet panel files of N symbols x --bars (written here) against "
                             "--synthetic of the same shape")
    parser.add_argument("--bars", type=int, default=400, help="--data: bars per symbol")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="kronos-backtest-bench-"))
    try:
        {"rss": mode_rss, "resume": mode_resume, "ranks": mode_ranks, "rate": mode_rate,
         "slow": mode_slow}[args.mode](args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
