"""How often the quality guard is right: the benchmark run N times with a planted worsening of the val loss.

    python -m benchmarks.quality_guard                          # 10 runs of the cpu preset, fused-adamw +2%
    python -m benchmarks.quality_guard --runs 3 --plant dataloader:0.02 -- --only dataloader

Each run is ``kronos-tune benchmark --preset P`` (arguments after ``--`` are passed on) with
``KRONOS_TUNE_TEST_WORSEN_VAL_LOSS=<trial>:<fraction>``, read in the trials by benchmarks.planted_trials: the named
trial's per-window validation losses are made worse by ``fraction`` on average, with noise of their own
(benchmarks/planted_trials.py). From each run's report.json the table shows the stated quality
resolution, the A/A comparison (noise-probe vs baseline: its interval should contain 0, and it is flagged when
it lies above the floor), the planted trial's interval and whether the guard flagged it, and the run's wall
time; the last lines count the planted worsenings flagged and the A/A comparisons flagged. Wall times taken on
a busy machine say little: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import child_env
from benchmarks.planted_trials import MODULE as PLANTED_CLI, WORSEN_ENV



def one_run(preset: str, plant: str, folder: Path, extra: list[str]) -> dict[str, Any]:
    """One benchmark run with the planted worsening; its figures from report.json."""
    command = [sys.executable, "-m", PLANTED_CLI, "benchmark", "--preset", preset, "--out", str(folder),
               *extra]
    started = time.perf_counter()
    done = subprocess.run(command, env=child_env({WORSEN_ENV: plant}), capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    report_file = folder / "report.json"
    if not report_file.is_file():
        return {"wall_s": wall, "error": (done.stderr.strip().splitlines() or ["no report.json"])[-1]}
    report = json.loads(report_file.read_text(encoding="utf-8"))
    quality = report.get("quality") or {}
    planted = next((t for t in report["trials"] if t["name"] == plant.split(":")[0]), {})
    return {"wall_s": wall, "resolution_pct": quality.get("resolution_pct"), "aa": quality.get("aa"),
            "tolerated_pct": quality.get("threshold_pct"), "planted": planted.get("quality"),
            "planted_status": planted.get("status")}


def _interval(figures: dict[str, Any] | None, low: str = "low_pct", high: str = "high_pct") -> str:
    if not figures or figures.get(low) is None:
        return "–"
    return f"[{figures[low]:+.2f}, {figures[high]:+.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality_guard", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--plant", default="fused-adamw:0.02", metavar="TRIAL:FRACTION")
    parser.add_argument("extra", nargs="*", help="arguments for kronos-tune benchmark (after --)")
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # one row per run as it ends, also into a pipe
    root = Path(tempfile.mkdtemp(prefix="kronos-quality-guard-"))
    print(f"{args.runs} runs of kronos-tune benchmark --preset {args.preset} {' '.join(args.extra)} with "
          f"{WORSEN_ENV}={args.plant} (folders under {root})")
    print(f"{'run':>3}  {'wall':>7}  {'resolution':>10}  {'A/A interval %':>16}  {'A/A':>7}  {'tolerated':>9}  "
          f"{'planted interval %':>18}  planted")
    planted_flagged = aa_flagged = counted = 0
    for index in range(1, args.runs + 1):
        row = one_run(args.preset, args.plant, root / f"run-{index:02d}", args.extra)
        if "error" in row:
            print(f"{index:>3}  {row['wall_s']:>6.0f}s  error: {row['error']}")
            continue
        aa, planted = row["aa"] or {}, row["planted"] or {}
        counted += 1
        aa_flagged += bool(aa.get("flagged"))
        planted_flagged += planted.get("passed") is False
        resolution = "–" if row["resolution_pct"] is None else f"{row['resolution_pct']:.2f}%"
        tolerated = "–" if row["tolerated_pct"] is None else f"+{row['tolerated_pct']:.2f}%"
        print(f"{index:>3}  {row['wall_s']:>6.0f}s  {resolution:>10}  {_interval(aa):>16}  "
              f"{'flagged' if aa.get('flagged') else 'ok':>7}  {tolerated:>9}  {_interval(planted):>18}  "
              f"{'flagged' if planted.get('passed') is False else 'passed' if planted else row['planted_status']}")
    print(f"planted worsening flagged: {planted_flagged} of {counted}; A/A flagged: {aa_flagged} of {counted}")
    return 0 if counted else 1


if __name__ == "__main__":
    sys.exit(main())
