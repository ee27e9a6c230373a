"""How often the timing rule is right: many short A/A and planted-effect comparisons, paired and sequential.

    python -m benchmarks.decisions --quick                 # a few minutes: quiet and periodic load
    python -m benchmarks.decisions --repeats 20 --load periodic
    python -m benchmarks.decisions --load-only --duration 900   # just the load, for another shell
    python -m benchmarks.decisions --benchmark-runs 10 --load periodic --plant fused-adamw:0.10

Two live trial workers train the tiny model (the same configuration, so every
difference between them is noise) and are compared over and over, in the two
designs the benchmark knows: *paired* (alternating short blocks in a seeded
random order, verdict from the block ratios against the run's resolution,
exactly as decision.py decides) and *sequential* (the baseline measured, then
the trial, then the baseline again for the drift threshold, as the benchmark
did before). An effect of 3, 5 or 10 % is planted by keeping the baseline's
thread busy that much longer per step (benchmarks.planted_trials' delay), so the
trial is truly that much faster. Each repeat runs an A/A comparison for the
resolution, a second A/A for the false-positive count, then the three planted
effects. The workers are planted from benchmarks.planted_trials (`set_delay`): the product's worker takes
no delay. ``--load periodic`` starts a process that keeps one core busy for
10 s, then idles 10 s, for the whole benchmark.

``--benchmark-runs N`` runs `kronos-tune benchmark --preset P` N times (under
the same load, its trials started from benchmarks.planted_trials, with KRONOS_TUNE_PLANT
when ``--plant`` is given) and prints a
table, one row per run: the wall time, the baseline's step time, the A/A
comparison (noise-probe: its change, interval and verdict), the resolution,
whether the run was too noisy, the planted trial's change, interval, verdict
and its effect in ms, and the recommendation; then the tallies "planted effect
found: k of N" (called faster in a run not too noisy) and "A/A not called
different: j of N". ``--json`` also writes the per-run rows and the tallies.
Timings taken on a busy machine say little: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import child_env
from benchmarks.planted_trials import MODULE as PLANTED_CLI, PLANT_ENV, set_delay, use_planted_trials

LOAD_CODE = """import time
while True:
    end = time.perf_counter() + {busy}
    while time.perf_counter() < end:
        pass
    time.sleep({idle})
"""
EFFECTS = (0.03, 0.05, 0.10)
DESIGNS = ("paired", "sequential")


@contextlib.contextmanager
def background_load(kind: str, busy_s: float = 10.0, idle_s: float = 10.0) -> Iterator[None]:
    """`kind` "periodic": one process keeping one core busy `busy_s`, then idle `idle_s`, until the block ends."""
    if kind != "periodic":
        yield
        return
    process = subprocess.Popen([sys.executable, "-c", LOAD_CODE.format(busy=busy_s, idle=idle_s)])
    try:
        yield
    finally:
        process.kill()
        process.wait()


@dataclass
class BenchRun:
    """What LiveWorker and Interleaver need of a run (context.RunContext's launch, watchdog, cancel, options)."""

    folder: Path
    options: Any
    trial_timeout_s: float = 300.0
    cancel: threading.Event = field(default_factory=threading.Event)

    def launch(self, spec: Any, work: Path, job: dict[str, Any], on_event: Any,
               deadline: Any = None) -> tuple[Any, Path]:
        from kronos_tune.benchmark.run.isolation import launch_trial

        stack_file = self.folder / f"{spec.name}-stacks.txt"
        return launch_trial(spec.name, 1, work, job, on_event, self.cancel, self.trial_timeout_s, stack_file,
                            deadline), stack_file


def tiny_job(name: str, seed: int, work: Path, eval_step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """A trial spec and job of the tiny model on synthetic data (by default no evaluation: only timing matters
    here)."""
    from kronos_core.train import TrainConfig
    from kronos_tune.benchmark.train.measure import TrialSteps
    from kronos_tune.benchmark.results import TrialSpec

    config = TrainConfig(what="predictor", model_size="tiny", data=["synthetic"], lookback_window=16,
                         predict_window=4, batch_size=8, samples_per_epoch=1_000_000, epochs=1, eval_samples=8,
                         synthetic_series=2, synthetic_rows=200, seed=seed, device="cpu", num_workers=0,
                         output_dir=str(work / "run"))
    trial_steps = TrialSteps(min_warmup=3, max_warmup=10, eval_step=eval_step)
    return (TrialSpec(name, "single", {}, config),
            {"config": config.to_dict(), "steps": trial_steps.to_dict(), "budget_bytes": None,
             "result_file": str(work / "result.json")})


def start_worker(run: BenchRun, name: str, seed: int, eval_step: int | None = None) -> Any:
    """A live worker of the tiny model; planted (its delay set by `set_delay`) once `use_planted_trials` ran."""
    from kronos_tune.benchmark.run.live_worker import LiveWorker

    work = run.folder / name
    work.mkdir(parents=True)
    spec, job = tiny_job(name, seed, work, eval_step)
    worker = LiveWorker(run, spec, work, job, who=f"the {name} worker")
    worker.ready()
    return worker


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def delay_for(effect: float) -> float:
    """The baseline's extra step time that makes the trial `effect` faster."""
    return effect / (1 - effect)


def paired_once(run: BenchRun, base: Any, trial: Any, effect: float, budget_s: float, steps: int,
                label: str) -> Any:
    """One paired comparison with `effect` planted: the stats.Comparison estimate (threshold set later)."""
    from kronos_tune.benchmark.run.paired import Interleaver
    from kronos_tune.benchmark.stats import block_ratios

    set_delay(trial.work, 0.0)  # the trial side never carries a delay
    set_delay(base.work, delay_for(effect))
    interleaver = Interleaver(run, label, steps, budget_s)
    interleaver.measure(base, trial)
    return block_ratios(interleaver.blocks)


def sequential_once(run: BenchRun, base: Any, trial: Any, effect: float, budget_s: float, steps: int) -> Any:
    """The baseline, the trial, the baseline again (each a third of the budget): as the benchmark was."""
    from kronos_tune.benchmark.train.decide import FLOOR
    from kronos_tune.benchmark.stats import compare

    long = steps * max(1, round(budget_s / 3 / max(1e-3, run.options.block_s)))
    set_delay(trial.work, 0.0)
    set_delay(base.work, delay_for(effect))
    first = base.block(long)
    measured = trial.block(long)
    again = base.block(long)
    drift = abs(_median(again) / _median(first) - 1)
    return compare(measured, first, max(FLOOR, drift))


def verdict_counts(rows: list[dict[str, Any]], design: str, load: str) -> dict[str, Any]:
    mine = [row for row in rows if row["design"] == design and row["load"] == load]
    null = [row for row in mine if row["effect"] == 0]
    out: dict[str, Any] = {"load": load, "design": design, "repeats": len(null),
                           "false_faster": sum(row["verdict"] == "faster" for row in null),
                           "false_slower": sum(row["verdict"] == "slower" for row in null),
                           "resolution_median_pct": 100 * _median([row["resolution"] for row in null])}
    for effect in EFFECTS:
        hits = [row for row in mine if row["effect"] == effect]
        out[f"detected_{round(100 * effect)}pct"] = f"{sum(row['verdict'] == 'faster' for row in hits)}/{len(hits)}"
    return out


def run_comparisons(loads: list[str], repeats: int, budget_s: float, block_s: float, seed: int,
                    say: Any = print) -> list[dict[str, Any]]:
    """Every comparison of the benchmark: per load, per repeat, per design: A/A (resolution), A/A (the null
    test), then the planted effects."""
    from kronos_tune.benchmark.train.decide import PAIRED_FLOOR
    from kronos_tune.benchmark.run.paired import steps_per_block
    from kronos_tune.benchmark.options import BenchmarkOptions
    from kronos_tune.benchmark.stats import aa_compare, paired_compare

    rows: list[dict[str, Any]] = []
    folder = Path(tempfile.mkdtemp(prefix="kronos-bench-decisions-"))
    options = BenchmarkOptions(seed=seed, block_s=block_s, min_rounds=8, target_ci=0.0, max_rounds=10_000)
    run = BenchRun(folder, options)
    use_planted_trials()
    try:
        base, trial = start_worker(run, "baseline", seed), start_worker(run, "trial", seed)
        step_s = _median(base.block(20))
        steps = steps_per_block(step_s, block_s)
        say(f"tiny model: {1000 * step_s:.1f} ms/step, {steps} steps per block, {budget_s:g} s per comparison")
        for load in loads:
            with background_load(load):
                for repeat in range(repeats):
                    for design in DESIGNS:
                        resolution = None
                        for index, effect in enumerate((0.0, 0.0, *EFFECTS)):
                            label = f"{load}-{design}-{repeat}-{index}"
                            if design == "paired":
                                ratios = paired_once(run, base, trial, effect, budget_s, steps, label)
                                if index == 0:
                                    reach = aa_compare(ratios, PAIRED_FLOOR).reach  # as decide.py does
                                    resolution = reach if reach is not None else float("inf")
                                    continue
                                found = paired_compare(ratios, max(PAIRED_FLOOR, resolution or 0.0))
                            else:
                                found = sequential_once(run, base, trial, effect, budget_s, steps)
                                if index == 0:
                                    resolution = found.threshold
                                    continue
                            rows.append({"load": load, "design": design, "repeat": repeat, "effect": effect,
                                         "ratio": found.ratio, "low": found.low, "high": found.high,
                                         "verdict": found.verdict, "resolution": resolution})
                    say(f"  {load}: repeat {repeat + 1}/{repeats} done")
        base.close()
        trial.close()
    finally:
        run.cancel.set()
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def _run_row(index: int, wall: float, report: dict[str, Any], planted: str | None) -> dict[str, Any]:
    """One benchmark run as a row of the table: the A/A comparison, the planted trial's, the resolution."""
    trials = {t["name"]: t for t in report["trials"]}
    timing = report.get("timing") or {}
    base_step = ((trials.get("baseline") or {}).get("step_time_s") or {}).get("median")
    row: dict[str, Any] = {"run": index, "wall_s": wall, "baseline_step_s": base_step,
                           "recommended": (report.get("recommended") or {}).get("source"),
                           "resolution_pct": timing.get("resolution_pct"), "noisy": bool(timing.get("noisy")),
                           "verdicts": {name: (t.get("comparison") or {}).get("verdict")
                                        for name, t in trials.items() if t.get("comparison")}}
    for key, name in (("aa", "noise-probe"), ("planted", planted)):
        comparison = (trials.get(name) or {}).get("comparison") if name else None
        row[key] = None if not comparison else {key_: comparison.get(key_) for key_ in ("ratio", "low", "high",
                                                                                          "verdict")}
    return row


def change_text(comparison: dict[str, Any] | None) -> str:
    if not comparison:
        return "-"
    interval = ("" if comparison["low"] is None else
                f" [{100 * (comparison['low'] - 1):+.1f}, {100 * (comparison['high'] - 1):+.1f}]")
    return f"{100 * (comparison['ratio'] - 1):+.1f}%{interval} {comparison['verdict']}"


def benchmark_table(rows: list[dict[str, Any]], planted: str | None) -> tuple[list[str], dict[str, Any]]:
    """The lines of the benchmark runs' table and its tallies: the planted effect found (called faster in a run
    that was not too noisy) and the A/A not called different (neither faster nor slower)."""
    lines = [f"{'run':>3} {'wall':>6} {'step':>7} {'A/A (noise-probe)':>30} {'resolution':>10} {'noisy':>5} "
             f"{'planted ' + (planted or '-'):>36} {'effect':>8}  recommended"]
    found = not_different = 0
    for row in rows:
        aa, hit = row["aa"], row["planted"]
        found += bool(hit and hit["verdict"] == "faster" and not row["noisy"])
        not_different += bool(aa and aa["verdict"] not in ("faster", "slower"))
        step = row["baseline_step_s"]
        effect = "-" if not hit or step is None else f"{1000 * step * (1 - hit['ratio']):.0f} ms"
        resolution = "-" if row["resolution_pct"] is None else f"{row['resolution_pct']:.1f}%"
        lines.append(f"{row['run']:>3} {row['wall_s']:>5.0f}s {'-' if step is None else f'{1000 * step:.0f} ms':>7} "
                     f"{change_text(aa):>30} {resolution:>10} {'yes' if row['noisy'] else 'no':>5} "
                     f"{change_text(hit):>36} {effect:>8}  {row['recommended']}")
    tallies = {"runs": len(rows), "planted": planted, "planted_found": found, "aa_not_different": not_different,
               "resolution_pct": sorted(r["resolution_pct"] for r in rows if r["resolution_pct"] is not None)}
    if planted:
        lines.append(f"planted effect found (called faster, run not too noisy): {found} of {len(rows)}")
    lines.append(f"A/A not called different (noise-probe neither faster nor slower): {not_different} of {len(rows)}")
    lines.append("effect: the baseline's step time x (1 - the planted trial's ratio); wall: the whole benchmark run")
    return lines, tallies


def benchmark_runs(count: int, preset: str, plant: str | None, out: Path, extra: list[str],
                  say: Any = print) -> list[dict[str, Any]]:
    """`kronos-tune benchmark --preset P` `count` times; one row per run that finished (_run_row)."""
    env = child_env({PLANT_ENV: plant} if plant else None)  # read by the planted trials' entry point
    planted = plant.rpartition(":")[0] if plant else None
    rows = []
    for index in range(count):
        folder = out / f"run-{index + 1}"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", PLANTED_CLI, "benchmark", "--preset", preset, "--out",
                               str(folder), "--json", *extra], env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            say(f"  run {index + 1}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
            continue
        rows.append(_run_row(index + 1, wall, json.loads(done.stdout), planted))
        say(f"  run {index + 1}: {wall:.0f} s, recommended {rows[-1]['recommended']}, resolution "
            f"{rows[-1]['resolution_pct']}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.decisions",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats of 2 s comparisons, quiet and periodic")
    parser.add_argument("--load", choices=("none", "periodic", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--budget", type=float, default=4.0, help="seconds per comparison")
    parser.add_argument("--block", type=float, default=0.05, help="seconds per paired block")
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--json", type=Path, help="also write every comparison here")
    parser.add_argument("--load-only", action="store_true", help="only run the periodic load (Ctrl-C ends it)")
    parser.add_argument("--duration", type=float, default=3600.0, help="--load-only: seconds")
    parser.add_argument("--benchmark-runs", type=int, default=0, help="run kronos-tune benchmark N times")
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--plant", help="NAME:FRACTION: that trial truly that much faster per step")
    parser.add_argument("--out", type=Path, help="--benchmark-runs: the folder of the runs")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                        help="--benchmark-runs: the rest of the line goes to kronos-tune benchmark (e.g. --only X)")
    args = parser.parse_args(argv)
    loads = {"none": ["none"], "periodic": ["periodic"], "both": ["none", "periodic"]}[args.load]
    if args.load_only:
        with background_load("periodic"):
            try:
                time.sleep(args.duration)
            except KeyboardInterrupt:
                pass
        return 0
    if args.benchmark_runs:
        out = args.out or Path(tempfile.mkdtemp(prefix="kronos-benchmark-runs-"))
        summary = {}
        for load in loads:
            with background_load(load):
                print(f"{args.benchmark_runs} x kronos-tune benchmark --preset {args.preset}, load {load}"
                      + (f", planted {args.plant}" if args.plant else ""), flush=True)
                rows = benchmark_runs(args.benchmark_runs, args.preset, args.plant, out / load, args.extra,
                                     say=lambda line: print(line, flush=True))
            lines, tallies = benchmark_table(rows, args.plant.rpartition(":")[0] if args.plant else None)
            print(f"\nload {load}:\n" + "\n".join(lines), flush=True)
            summary[load] = {"rows": rows, **tallies}
        if args.json:
            args.json.write_text(json.dumps(summary, indent=2), encoding="utf-8")
        return 0
    repeats, budget = (3, 2.0) if args.quick else (args.repeats, args.budget)
    rows = run_comparisons(loads, repeats, budget, args.block, args.seed,
                           say=lambda line: print(line, flush=True))
    print(f"\n{'load':9} {'design':11} {'repeats':>7} {'A/A faster':>10} {'A/A slower':>10} "
          f"{'3%':>6} {'5%':>6} {'10%':>6} {'resolution':>10}")
    for load in loads:
        for design in DESIGNS:
            c = verdict_counts(rows, design, load)
            print(f"{load:9} {design:11} {c['repeats']:7d} {c['false_faster']:10d} {c['false_slower']:10d} "
                  f"{c['detected_3pct']:>6} {c['detected_5pct']:>6} {c['detected_10pct']:>6} "
                  f"{c['resolution_median_pct']:9.1f}%")
    print("A/A faster/slower: an A/A comparison (no effect) called faster/slower (false positives); 3/5/10%: planted "
          "effects called faster (detections); resolution: the median A/A interval reach (paired) or drift "
          "threshold (sequential).")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
