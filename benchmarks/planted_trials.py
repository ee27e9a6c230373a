"""The benchmark's trial workers with planted faults, effects and worsenings (tests, benchmarks).

    python -m benchmarks.planted_trials benchmark --preset cpu ...   # the CLI, its trials started from here

The product's trial worker (`kronos_tune.benchmark.run.trial_worker`) takes `TrialHooks`; this module is the
entry point that passes them, read from three variables that only it reads:

- KRONOS_TUNE_FAULT=KIND:TRIAL[,KIND:TRIAL...]: `hang` blocks the trial in its first step, as a deadlocked
  kernel or loader would (SIGTERM ignored); `hang-block` in its third paired block, `die-block` exits with an
  error there.
- KRONOS_TUNE_PLANT=TRIAL:FRACTION (the decision benchmark's planted effect): every other trial's steps are
  made that much slower, so the named trial is truly FRACTION faster per step (work, not a sleep:
  train/measure.py's spin).
- KRONOS_TUNE_TEST_WORSEN_VAL_LOSS=TRIAL:FRACTION[:SEED] (the quality guard's planted worsening): the named
  trial's validation windows are made worse before its result is written, each window's loss times
  1 + FRACTION x (1 + z / 2), z a standard normal draw per window (seeded when SEED is given): a worsening of
  FRACTION on average with noise of its own. The measurement itself is untouched.

`use_planted_trials()` makes this process's benchmark start its trials from this module (what the CLI form
above does before it runs the command); the variables reach the trials through the environment, and the
repository root is put on PYTHONPATH so that they can import `benchmarks` from any working directory.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

from benchmarks import run_kronos_tune

FAULT_ENV = "KRONOS_TUNE_FAULT"
PLANT_ENV = "KRONOS_TUNE_PLANT"
WORSEN_ENV = "KRONOS_TUNE_TEST_WORSEN_VAL_LOSS"
MODULE = "benchmarks.planted_trials"
REPO_ROOT = Path(__file__).resolve().parents[1]


def fault(trial: str) -> str | None:
    """The fault KRONOS_TUNE_FAULT plants in `trial` ("kind:trial", several joined by commas)."""
    for item in os.environ.get(FAULT_ENV, "").split(","):
        kind, _, name = item.strip().partition(":")
        if kind and name == trial:
            return kind
    return None


def planted_delay(trial: str) -> float:
    """The extra fraction of step time KRONOS_TUNE_PLANT gives `trial`: 0 for the named one, f / (1 - f) for
    every other, so that the named one is `f` faster per step."""
    name, _, fraction = os.environ.get(PLANT_ENV, "").rpartition(":")
    if not name:
        return 0.0
    try:
        faster = float(fraction)
    except ValueError:
        return 0.0
    if name == trial or not 0 < faster < 1:
        return 0.0
    return faster / (1 - faster)


def worsen_for_test(result: Any, trial: str) -> None:
    """KRONOS_TUNE_TEST_WORSEN_VAL_LOSS (module docstring) on `result`'s validation windows and loss; nothing for
    any other trial or without the variable."""
    name, _, rest = os.environ.get(WORSEN_ENV, "").partition(":")
    fraction, _, seed = rest.partition(":")
    if not name or name != trial or not result.val_windows:
        return
    draw = random.Random(seed) if seed else random.Random()
    result.val_windows = [[loss * (1 + float(fraction) * (1 + draw.gauss(0.0, 1.0) / 2)), weight]
                          for loss, weight in result.val_windows]
    total = sum(weight for _, weight in result.val_windows)
    result.val_loss = sum(loss * weight for loss, weight in result.val_windows) / total


def hooks():
    from kronos_tune.benchmark.run.trial_worker import TrialHooks

    return TrialHooks(fault=fault, delay=planted_delay, after_result=worsen_for_test)


def use_planted_trials() -> None:
    """The benchmark run by this process starts its trials from this module."""
    from kronos_tune.benchmark.run import isolation

    isolation.WORKER_MODULE = MODULE
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(REPO_ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, paths)])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--job"]:  # the launcher starting a trial
        from kronos_tune.benchmark.run.trial_worker import main as worker_main

        return worker_main(args, hooks())
    use_planted_trials()
    return run_kronos_tune(args)


if __name__ == "__main__":
    sys.exit(main())
