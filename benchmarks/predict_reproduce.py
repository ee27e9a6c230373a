"""Does `kronos-tune predict --config RUN/recommended.toml` run as fast as the predict benchmark said?

    python -m benchmarks.predict_reproduce --preset cpu --repeats 5
    python -m benchmarks.predict_reproduce --run runs/benchmark/<run>     # reuse a finished benchmark run

Runs `kronos-tune benchmark --task predict` (unless --run names a finished one), then `kronos-tune predict
--config RUN/recommended.toml --json` --repeats times: the file holds every key the recommended trial ran with,
its synthetic series (`synthetic`, `seed`, the shape) included, so predict predicts the same series with the
same settings and chunk size. Prints, side by side, the benchmark's series/s of the recommended trial (median
[IQR] over its timed passes) and predict's over the repeats: the command's own figure (series / its
predict_seconds, which also holds the predictor's build and the first call's warm-up) and the pipeline's
(series / the chunks' summed seconds, per rank the longest: what the benchmark's passes time), each with its
median, range and count, its ratio to the benchmark's median and whether that lies within the run's stated
resolution (report.json timing.threshold_pct). Timings taken on a busy machine say little: run it on a quiet
one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "kronos_tune.cli", *args]


def run_json(command: list[str]) -> dict[str, Any]:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise SystemExit(f"{' '.join(command[2:6])} ...: exit {done.returncode}: {tail}")
    return json.loads(done.stdout)


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return (f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}] n={len(values)}")


def benchmark_figure(report: dict[str, Any]) -> tuple[str, dict[str, Any], float | None]:
    """(the recommended trial's name, its series/s spread as report.json holds it, the resolution in %)."""
    source = (report.get("recommended") or {}).get("source")
    if source is None:
        raise SystemExit("the benchmark recommended nothing (report.json has no recommendation)")
    trial = next(t for t in report["trials"] if t["name"] == source)
    rate = trial.get("series_per_s")
    if not isinstance(rate, dict):
        raise SystemExit(f"{source}: no series/s in report.json")
    return source, rate, (report.get("timing") or {}).get("threshold_pct")


def pipeline_rate(result: dict[str, Any]) -> float | None:
    """Series / the longest rank's summed chunk seconds (one process: all its chunks)."""
    ranks = (result.get("job") or {}).get("ranks") or {}
    busiest = max((float(r["seconds"]) for r in ranks.values()), default=0.0)
    return result["series_predicted"] / busiest if busiest > 0 else None


def verdict(values: list[float], reference: float, resolution_pct: float | None) -> str:
    if not values:
        return ""
    ratio = statistics.median(values) / reference
    within = "" if resolution_pct is None else (
        f", {'within' if abs(ratio - 1) * 100 <= resolution_pct else 'outside'} the run's ±{resolution_pct:.1f}%")
    return f"x{ratio:.3f} of the benchmark{within}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.predict_reproduce", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--run", type=Path, help="a finished predict benchmark run folder (skip the benchmark)")
    parser.add_argument("--repeats", type=int, default=5, help="predict runs")
    parser.add_argument("--out", type=Path, help="where the benchmark run goes (default: a temporary folder)")
    parser.add_argument("extra", nargs="*", help="more benchmark flags, after --, e.g. -- --predict-series 256")
    args = parser.parse_args(argv)
    run = args.run
    if run is None:
        run = (args.out or Path(tempfile.mkdtemp(prefix="kronos-reproduce-"))) / "run"
        print(f"benchmark: kronos-tune benchmark --preset {args.preset} --task predict --out {run} "
              f"{' '.join(args.extra)}", flush=True)
        run_json(cli("benchmark", "--preset", args.preset, "--task", "predict", "--out", str(run), "--json",
                     *args.extra))
    report = json.loads((run / "report.json").read_text())
    source, rate, resolution = benchmark_figure(report)
    config = run / "recommended.toml"
    print(f"recommended: {source}; predict: kronos-tune predict --config {config} --json", flush=True)
    command_rates: list[float] = []
    chunk_rates: list[float] = []
    for repeat in range(args.repeats):
        result = run_json(cli("predict", "--config", str(config), "--json"))
        command_rates.append(float(result["series_per_s"]))
        chunked = pipeline_rate(result)
        if chunked is not None:
            chunk_rates.append(chunked)
        print(f"  predict {repeat + 1}/{args.repeats}: {result['series_predicted']} series, "
              f"{command_rates[-1]:.2f} series/s (command), "
              f"{'-' if chunked is None else f'{chunked:.2f}'} series/s (chunks)", flush=True)
    median = float(rate["median"])
    iqr = (f"[{rate['q1']:.2f}-{rate['q3']:.2f}]" if rate.get("q1") is not None else
           f"[{rate['min']:.2f}-{rate['max']:.2f}]")
    print()
    print(f"{'':38}{'series/s: median [spread] n':36}vs the benchmark")
    label, figure = f"benchmark ({source}, timed passes)", f"{median:.2f} {iqr} n={rate['n']}"
    stated = "none stated" if resolution is None else f"the run's resolution ±{resolution:.1f}%"
    print(f"{label:38}{figure:36}{stated}")
    print(f"{'predict, the command':38}{spread(command_rates):36}{verdict(command_rates, median, resolution)}")
    print(f"{'predict, its chunks':38}{spread(chunk_rates):36}{verdict(chunk_rates, median, resolution)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
