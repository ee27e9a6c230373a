"""The benchmark's tasks by name: "train" and "predict" (each a BenchmarkTask, task.py)."""

from __future__ import annotations

from typing import Any

from kronos_tune.benchmark.options import BenchmarkOptions
from kronos_tune.benchmark.predict.task import PredictBenchmark
from kronos_tune.benchmark.results import BenchmarkReport, TrialSpec
from kronos_tune.benchmark.selection import check_names, resolve
from kronos_tune.benchmark.task import BenchmarkTask
from kronos_tune.benchmark.train.task import TrainBenchmark
from kronos_tune.errors import KronosTuneError
from kronos_tune.presets import Preset
from kronos_tune.workloads import runnable_device

TASKS: dict[str, BenchmarkTask] = {task.name: task for task in (TrainBenchmark(), PredictBenchmark())}


def get(name: str) -> BenchmarkTask:
    task = TASKS.get(name)
    if task is None:
        raise KronosTuneError(f"unknown task '{name}'; use one of {', '.join(TASKS)}")
    return task


def report_from_dict(data: dict[str, Any]) -> BenchmarkReport:
    """A report.json read back, its decision typed by its task."""
    return BenchmarkReport.from_dict(data, get(data["task"]).read_decision)


def check_options(task: str, options: BenchmarkOptions) -> BenchmarkTask:
    """The task, once its name and the options are known good (else one line, KronosTuneError): what a
    command checks before it loads the runner."""
    chosen = get(task)
    check_names(task, options, chosen.trial_names)
    chosen.check(options)
    return chosen


def plan_trials(preset: Preset | str, task: str = "train",
                options: BenchmarkOptions = BenchmarkOptions()) -> list[TrialSpec]:
    """Every trial of the benchmark in run order (baseline first, combined last), skipped ones with their reason."""
    preset = resolve(preset)
    chosen = check_options(task, options)
    device, _ = runnable_device(preset)
    return chosen.plan(preset, options, device)
