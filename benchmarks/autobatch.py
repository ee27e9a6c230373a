"""How good is autobatch's pick, and what does the search cost? Real steps on this CPU.

    python -m benchmarks.autobatch [--task train|predict] [--preset cpu] [--model-size tiny]
                                         [--budget-gb 0.5] [--margin F] [--train-steps 20] [--repeats 3]

train: runs ``autobatch`` on the preset's fine-tuning workload (model size
overridable to keep it short) against a simulated device of ``--budget-gb``;
then finds the largest batch that truly fits, by galloping + bisection with
fresh real probes (2 steps + eval each) under the usable cap and under the
full budget (the fit only supplies the first guess; every answer is bracketed
by a size that ran and the next one that did not); times the training step at
the pick without the meter; and trains ``--train-steps`` optimizer steps plus a
full evaluation at the pick on the simulated device, counting out-of-memory
errors.

predict: picks the call size (series per call) for the preset's predict workload
under ``--budget-gb``, then sweeps call sizes up to the pick, timing series/s
over all the preset's series (median/min/max over ``--repeats``), and compares
the pick with the fastest call size.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from kronos_core.train import Trainer
from kronos_core.units import format_bytes
from kronos_tune.autobatch.predict_probes import PredictProbes
from kronos_tune.autobatch.probes import AutobatchResult
from kronos_tune.memory.peak import default_margin
from kronos_tune.autobatch.train_probes import TrainProbes
from kronos_tune.workloads import train_config_from_preset
from kronos_tune.memory import CpuExactMeter, OutOfMemoryError
from kronos_tune.memory.peak import largest_fitting
from kronos_tune.presets import BYTES_PER_GIB, Preset, resolve_preset

DEFAULT_BUDGET_GB = {"train": 0.5, "predict": 0.05}


def stats(values: Sequence[float], unit: str, digits: int = 3) -> str:
    if not values:
        return "n/a"
    f = f"{{:.{digits}f}}"
    return (f"median {f.format(statistics.median(values))} {unit} (min {f.format(min(values))}, "
            f"max {f.format(max(values))}, n={len(values)})")


def _true_max(fits: Callable[[int], bool], guess: int) -> tuple[int, int]:
    """(the largest batch that fits, runs it took), searched as the planner searches."""
    runs = 0

    def counted(batch_size: int) -> bool:
        nonlocal runs
        runs += 1
        return fits(batch_size)

    found = largest_fitting(counted, 1, 1 << 16, guess)
    if found is None:
        raise SystemExit("not even batch size 1 fits the budget")
    return found, runs


def _train_fits(task: TrainProbes, cap_bytes: int) -> Callable[[int], bool]:
    """A fresh Trainer at the batch size: 2 steps and an eval batch under a CpuExactMeter of cap_bytes."""

    def fits(batch_size: int) -> bool:
        meter = CpuExactMeter(budget_bytes=cap_bytes)
        trainer = None
        try:
            with meter:
                trainer = Trainer(task.probe_config(batch_size), meter=meter)
                trainer.run_steps(2)
                trainer.eval_batch()
            return True
        except OutOfMemoryError:
            return False
        finally:
            if trainer is not None:
                trainer.close()
            trainer = None
            gc.collect()

    return fits


def _print_probes(result: AutobatchResult) -> None:
    for probe in result.probes:
        peak = format_bytes(probe.peak_bytes) if probe.peak_bytes is not None else "out of memory"
        print(f"    {probe.kind:7s} {probe.batch_size:6d}  {peak:>12s}  {probe.status:6s}  {probe.wall_time_s:6.1f} s")


def bench_train(preset: Preset, model_size: str | None, budget_bytes: int, margin: float, train_steps: int,
                repeats: int) -> None:
    config, _ = train_config_from_preset(preset)
    if model_size:
        config = config.replace(model_size=model_size)
    margin = default_margin("cpu") if margin is None else margin
    usable = int(budget_bytes * (1 - margin))
    print(f"train: Kronos-{config.model_size}, windows {config.lookback_window}+{config.predict_window}+1, "
          f"amp {config.amp}, simulated cpu device {format_bytes(budget_bytes)} (usable {format_bytes(usable)}, "
          f"margin {margin:.0%}), torch threads {torch.get_num_threads()}")
    with TrainProbes(config, device="cpu") as task:
        result = task.run(budget_bytes, margin=margin)
        print(f"  autobatch pick: {result.batch_size}  ({result.search_probes} search probes + "
              f"{len(result.probes) - result.search_probes} verification runs, {result.probe_steps} training "
              f"steps, {result.search_time_s:.1f} s)")
        _print_probes(result)
        print(f"  fit: fixed {format_bytes(result.fixed_bytes)} + {format_bytes(result.bytes_per_sample)} x B; "
              f"predicted {format_bytes(result.predicted_peak_bytes)}, measured "
              f"{format_bytes(result.measured_peak_bytes)} at the pick")

        start = time.perf_counter()
        true_usable, probes_usable = _true_max(_train_fits(task, usable), result.batch_size)
        per_sample = max(result.bytes_per_sample, 1.0)
        guess = true_usable + int((budget_bytes - usable) / per_sample)
        true_budget, probes_budget = _true_max(_train_fits(task, budget_bytes), guess)
        truth_s = time.perf_counter() - start
        print(f"  true max (gallop + bisection, real steps, {probes_usable + probes_budget} probes, {truth_s:.1f} s): "
              f"{true_usable} under the usable cap, {true_budget} under the full budget")
        print(f"  pick / true max under the usable cap: {result.batch_size / true_usable:.3f}; "
              f"under the full budget: {result.batch_size / true_budget:.3f}")

        run_config = task.final_config(result.batch_size, 1).replace(
            samples_per_epoch=result.batch_size * max(train_steps, 1), epochs=1,
            output_dir=str(task.work_dir / "train-run"), device="cpu", data=["synthetic"],
            synthetic_series=max(config.synthetic_series, 8))
        trainer = Trainer(run_config)
        timed = [r.step_time_s for r in trainer.run_steps(repeats + 1)][1:]  # first step: lazy state, warm-up
        trainer.close()
        del trainer
        gc.collect()
        step_s = statistics.median(timed)
        print(f"  step at the pick without the meter: {stats(timed, 's')}")
        print(f"  search cost: {result.search_time_s / step_s:.1f} training steps at the pick "
              f"({result.search_time_s:.1f} s / {step_s:.3f} s)")

        meter = CpuExactMeter(budget_bytes=budget_bytes)
        ooms = 0
        start = time.perf_counter()
        try:
            with meter:
                trainer = Trainer(run_config.replace(output_dir=str(task.work_dir / "train-run-metered")),
                                  meter=meter)
                summary = trainer.fit(train_steps)
                trainer.close()
        except OutOfMemoryError as error:
            ooms += 1
            print(f"  training run OUT OF MEMORY: {error}")
            summary = None
        wall = time.perf_counter() - start
        if summary is not None:
            val = summary.last_eval or {}
            print(f"  training run at the pick on the simulated device: {summary.steps} steps + evaluation "
                  f"({trainer.eval_windows} windows) in {wall:.1f} s, out-of-memory errors {ooms + meter.num_ooms}, "
                  f"peak {format_bytes(meter.peak_bytes())} = {meter.peak_bytes() / budget_bytes:.1%} of the budget, "
                  f"last loss {summary.last_loss:.3f}, val loss {val.get('val_loss', float('nan')):.3f}")


def bench_predict(preset: Preset, model_size: str | None, budget_bytes: int, margin: float, repeats: int) -> None:
    p = preset.predict
    size = model_size or preset.workload.model_size
    task = PredictProbes(size, p.lookback, p.pred_len, p.sample_count, p.series_count, device="cpu")
    print(f"predict: Kronos-{size}, {p.series_count} series x {p.sample_count} sample(s), {p.lookback} in / "
          f"{p.pred_len} out, simulated cpu device {format_bytes(budget_bytes)} "
          f"(margin {default_margin('cpu') if margin is None else margin:.0%})")
    pick = task.run(budget_bytes, margin=margin, timing_calls=1)
    result = pick.result
    print(f"  autobatch pick: {pick.series_per_call} series per call = max_batch_size {pick.max_batch_size} "
          f"({len(result.probes)} runs, {result.search_time_s:.1f} s)")
    _print_probes(result)
    print(f"  peak at the pick {format_bytes(result.measured_peak_bytes)} = "
          f"{result.measured_peak_bytes / budget_bytes:.1%} of the budget")

    sizes = sorted({s for s in (1, 4, 16, 64, 256, 1024) if s < pick.series_per_call} | {pick.series_per_call})
    task.throughput(sizes[0], calls=1, repeats=1)  # warm-up (first calls allocate and fill caches)
    rows: list[tuple[int, list[float]]] = []
    for per_call in sizes:
        series = min(p.series_count, max(8, 2 * per_call))  # whole calls where possible, never fewer than 8
        rates = task.throughput(per_call, calls=max(1, -(-series // per_call)), repeats=repeats)
        rows.append((per_call, rates))
        print(f"    call of {per_call:4d} series (timed on {min(series, p.series_count)} series): "
              f"{stats(rates, 'series/s', 2)}")
    best_call, best_rates = max(rows, key=lambda row: statistics.median(row[1]))
    pick_rates = dict(rows)[pick.series_per_call]
    print(f"  fastest call in the sweep: {best_call} series ({statistics.median(best_rates):.2f} series/s); "
          f"the pick {pick.series_per_call}: {statistics.median(pick_rates):.2f} series/s = "
          f"{statistics.median(pick_rates) / statistics.median(best_rates):.1%} of the fastest")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.autobatch", description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("train", "predict"), default="train")
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--model-size", default="tiny", help="override the preset's model size ('' keeps it)")
    parser.add_argument("--budget-gb", type=float, default=None, help="simulated device size in GiB "
                                                                      "(default: 0.5 train, 0.05 predict)")
    parser.add_argument("--margin", type=float, default=None, help="default: autobatch's (5%% on the CPU meter)")
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--preset-dir", type=Path, action="append", default=None)
    args = parser.parse_args(argv)
    preset = resolve_preset(args.preset, args.preset_dir)
    budget_gb = args.budget_gb if args.budget_gb is not None else DEFAULT_BUDGET_GB[args.task]
    budget_bytes = int(round(budget_gb * BYTES_PER_GIB))
    print(f"preset {preset.name}; torch {torch.__version__}; {torch.get_num_threads()} threads; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (timings are wall clock)")
    if args.task == "train":
        bench_train(preset, args.model_size or None, budget_bytes, args.margin, args.train_steps, args.repeats)
    else:
        bench_predict(preset, args.model_size or None, budget_bytes, args.margin, args.repeats)


if __name__ == "__main__":
    main()
