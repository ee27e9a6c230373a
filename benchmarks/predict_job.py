"""Large prediction jobs (`kronos-tune predict --out`): memory, end-to-end speed, resume, chunks claimed by speed.

    python -m benchmarks.predict_job rss --series 10000 30000 100000 [1000000] [--csv 10000 30000]
    python -m benchmarks.predict_job throughput --series 100000 --repeats 3
    python -m benchmarks.predict_job resume --series 100000
    python -m benchmarks.predict_job ranks --series 20000 --slow 3 --repeats 3
    python -m benchmarks.predict_job shard PANEL.csv --symbol-column Symbol --nproc 2 --repeats 3

Every mode writes its panels (80 daily bars per symbol, sorted by symbol, random walks) and outputs in a
new folder (removed unless --keep) and runs the real command line, Kronos-tiny random weights on the CPU,
lookback 64, pred-len 4, default sampling, one command at a time:

- rss: the peak resident memory per panel size, as `/usr/bin/time -v` reports it (the kernel's ru_maxrss of
  the command, read with wait4), Parquet (read in symbol batches) and, for --csv sizes, the same panel as CSV
  (read whole); the tree's summed RSS polled by psutil is kept in the JSON. Not a timing.
- throughput: end-to-end series/s of the command (interpreter start to exit) against the prediction
  alone (`predict_arrays` over the same series in this process), interleaved, --repeats each.
- resume: a full run; a run killed with SIGKILL once half its chunks are finished; --resume of it; the
  resumed part's wall against the full run's, and whether the outputs are byte-identical.
- ranks: two gloo ranks, rank 1 made --slow times slower (KRONOS_BENCH_SLOW_RANK, read by the ranks' entry
  point benchmarks/planted_ranks.py);
  chunks claimed (default chunk size) against a static split (two chunks of half the series each, one per
  rank); each against the ideal (all series / the ranks' combined speed, measured in the claimed run).
- shard: a given panel with one process and with --nproc N (what scripts/bench_panel_predict.py did):
  median series/s over --repeats and whether the outputs are identical.

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
import time
from pathlib import Path

from benchmarks.predict_job_runs import Measured, predict_command, run_measured, write_panel

MIB = 2 ** 20


def load() -> str:
    return "load average " + " ".join(f"{value:.2f}" for value in os.getloadavg())


def spread(values: list[float]) -> str:
    return (f"median {statistics.median(values):.3g} (min {min(values):.3g}, max {max(values):.3g}, "
            f"{len(values)} runs)")


def checked(measured: Measured, what: str) -> dict:
    if measured.returncode != 0:
        raise SystemExit(f"error: {what} exited with {measured.returncode}: {measured.stderr.strip()[-800:]}")
    return json.loads(measured.stdout)


def mode_rss(args: argparse.Namespace, work: Path) -> list[dict]:
    rows = []
    for fmt, sizes in (("parquet", args.series), ("csv", args.csv or [])):
        for series in sizes:
            panel = write_panel(work / f"panel-{series}.{fmt}", series)
            out = work / f"out-{series}-{fmt}.parquet"
            measured = run_measured(predict_command(panel, out))
            report = checked(measured, f"predict over {series} series ({fmt})")
            rows.append({"series": series, "format": fmt, "peak_rss_mib": measured.max_rss_bytes / MIB,
                         "tree_rss_polled_mib": measured.peak_rss_bytes / MIB, "wall_s": measured.wall_s,
                         "written_rows": report["job"]["rows"]})
            print(f"{series:>9,} series  {fmt:<7}  peak RSS {measured.max_rss_bytes / MIB:8.1f} MiB (ru_maxrss, as "
                  f"/usr/bin/time -v)  (wall {measured.wall_s:.1f} s; {load()})", flush=True)
            out.unlink()
            panel.unlink()
    base = next((r for r in rows if r["format"] == "parquet"), None)
    for row in rows:
        if base is not None and row is not base and row["format"] == "parquet":
            print(f"{row['series']:,} / {base['series']:,} series: peak RSS x{row['peak_rss_mib'] / base['peak_rss_mib']:.2f}")
    return rows


def mode_throughput(args: argparse.Namespace, work: Path) -> dict:
    from kronos_tune.predict.config import PredictConfig
    from kronos_tune.predict.inputs import load_inputs
    from kronos_tune.predict.job import load_predictor
    from kronos_tune.predict.chunk_run import stream_arguments

    series = args.series[0]
    panel = write_panel(work / "panel.parquet", series)
    config = PredictConfig(lookback=64, pred_len=4, size="tiny", device="cpu", data=(panel,), symbol_column="symbol")
    inputs = load_inputs(config, lambda level, text: None)
    predictor = load_predictor(config, lambda level, text: None)
    streams = stream_arguments(inputs.names, inputs.last_ns, config.seed)
    end_to_end, alone = [], []
    for repeat in range(args.repeats):
        out = work / f"out-{repeat}.parquet"
        measured = run_measured(predict_command(panel, out))
        end_to_end.append(checked(measured, "predict")["series"] / measured.wall_s)
        out.unlink()
        started = time.perf_counter()
        predictor.predict_arrays(inputs.x, inputs.x_stamp, inputs.y_stamp, mean_only=True, **streams)
        alone.append(len(inputs.names) / (time.perf_counter() - started))
        print(f"repeat {repeat + 1}: end to end {end_to_end[-1]:.1f} series/s, prediction alone {alone[-1]:.1f} "
              f"series/s ({load()})", flush=True)
    ratio = statistics.median(end_to_end) / statistics.median(alone)
    print(f"{series:,} series: end to end {spread(end_to_end)} series/s; prediction alone {spread(alone)} series/s; "
          f"ratio of medians {ratio:.2f} (target >= 0.75)")
    return {"series": series, "end_to_end_series_per_s": end_to_end, "alone_series_per_s": alone, "ratio": ratio}


def mode_resume(args: argparse.Namespace, work: Path) -> dict:
    series = args.series[0]
    panel = write_panel(work / "panel.parquet", series)
    full = run_measured(predict_command(panel, work / "full.parquet"))
    report = checked(full, "full run")
    chunks = report["job"]["chunks"]
    out = work / "cut.parquet"
    done = work / "cut.parquet.work" / "done"

    def kill_at_half(process) -> None:  # called while the process runs (run_measured reaps it)
        if done.is_dir() and len(list(done.glob("*.json"))) >= chunks / 2:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    killed = run_measured(predict_command(panel, out), on_poll=kill_at_half)
    kept = len(list(done.glob("*.json")))
    absent = not out.exists()
    resumed = run_measured(predict_command(panel, out, "--resume"))
    checked(resumed, "resume")
    identical = out.read_bytes() == (work / "full.parquet").read_bytes()
    ratio = resumed.wall_s / full.wall_s
    print(f"{series:,} series, {chunks} chunks: full run {full.wall_s:.1f} s; killed (code {killed.returncode}) with "
          f"{kept} chunks finished, --out absent: {'yes' if absent else 'NO'}; resumed part {resumed.wall_s:.1f} s = "
          f"{ratio:.2f} of the full run (target <= 0.6); outputs byte-identical: {'yes' if identical else 'NO'} "
          f"({load()})")
    return {"series": series, "chunks": chunks, "kept_chunks": kept, "out_absent": absent, "full_s": full.wall_s,
            "resumed_s": resumed.wall_s, "ratio": ratio, "identical": identical}


def _busy(report: dict) -> tuple[float, float]:
    """(wall of the ranks' work: the longest rank's busy seconds, combined speed in series/s)."""
    ranks = report["job"]["ranks"].values()
    return max(r["seconds"] for r in ranks), sum(r["series"] / r["seconds"] for r in ranks if r["seconds"])


def mode_ranks(args: argparse.Namespace, work: Path) -> dict:
    series = args.series[0]
    panel = write_panel(work / "panel.parquet", series)
    env = {**os.environ, "KRONOS_BENCH_SLOW_RANK": f"1:{args.slow}"}
    claimed_ratio, static_ratio = [], []
    for repeat in range(args.repeats):
        runs = {}
        for name, extra in (("claimed", ["--chunk-series", str(args.chunk_series)]),
                            ("static", ["--chunk-series", str(-(-series // 2))])):
            out = work / f"{name}-{repeat}.parquet"
            command = predict_command(panel, out, "--nproc", "2", *extra)
            planted = [command[0], "-m", "benchmarks.planted_ranks", *command[3:]]  # the CLI, ranks with hooks
            runs[name] = checked(run_measured(planted, env=env), name)
            out.unlink()
        claimed_wall, speed = _busy(runs["claimed"])
        static_wall, _ = _busy(runs["static"])
        ideal = series / speed
        claimed_ratio.append(claimed_wall / ideal)
        static_ratio.append(static_wall / ideal)
        print(f"repeat {repeat + 1}: ideal {ideal:.1f} s; claimed {claimed_wall:.1f} s (x{claimed_ratio[-1]:.2f}, "
              f"chunks per rank {[r['chunks'] for r in runs['claimed']['job']['ranks'].values()]}); static "
              f"{static_wall:.1f} s (x{static_ratio[-1]:.2f}) ({load()})", flush=True)
    print(f"two gloo ranks, rank 1 x{args.slow} slower, {series:,} series: claimed / ideal {spread(claimed_ratio)} "
          f"(target <= 1.2); static split / ideal {spread(static_ratio)}")
    return {"series": series, "slow": args.slow, "claimed_over_ideal": claimed_ratio,
            "static_over_ideal": static_ratio}


def mode_shard(args: argparse.Namespace, work: Path) -> dict:
    import pandas as pd

    results = {}
    reference = None
    for nproc in (1, args.nproc):
        rates, identical = [], True
        for repeat in range(1 + args.repeats):
            out = work / f"nproc{nproc}-{repeat}.parquet"
            command = predict_command(args.panel, out, *(["--nproc", str(nproc)] if nproc > 1 else []),
                                      lookback=args.lookback, pred_len=args.pred_len, size=args.size)
            command[command.index("--symbol-column") + 1] = args.symbol_column
            measured = run_measured(command)
            report = checked(measured, f"--nproc {nproc}")
            if repeat:  # the first call pays for a cold file cache and imports
                rates.append(report["series"] / measured.wall_s)
            reference = reference or out
            identical &= pd.read_parquet(out).equals(pd.read_parquet(reference))
        results[nproc] = {"series_per_s": rates, "identical": identical}
        print(f"--nproc {nproc}: {spread(rates) if rates else 'no timed call'} series/s end to end; output identical "
              f"to one process: {'yes' if identical else 'NO'} ({load()})", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("rss", "throughput", "resume", "ranks", "shard"))
    parser.add_argument("panel", type=Path, nargs="?", help="shard: the panel file")
    parser.add_argument("--series", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    parser.add_argument("--csv", type=int, nargs="*", help="rss: also these sizes as CSV panels")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slow", type=float, default=3.0, help="ranks: how many times slower rank 1 is")
    parser.add_argument("--chunk-series", type=int, default=256, help="ranks: chunk size of the claimed run")
    parser.add_argument("--symbol-column", default="symbol")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--lookback", type=int, default=64)
    parser.add_argument("--pred-len", type=int, default=4)
    parser.add_argument("--keep", action="store_true", help="keep the panels and outputs (the folder is printed)")
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON object")
    args = parser.parse_args(argv)
    if args.mode == "shard" and args.panel is None:
        parser.error("shard needs the panel file")
    work = Path(tempfile.mkdtemp(prefix="kronos-bench-job-"))
    print(f"{args.mode}: Kronos-{args.size} random weights on the CPU, work in {work}; {load()}", flush=True)
    try:
        result = globals()[f"mode_{args.mode}"](args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
