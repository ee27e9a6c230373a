"""The benchmark's trial workers with planted faults, effects and worsenings (tests, benchmarks).

    python -m benchmarks.planted_trials benchmark --preset cpu ...   # the CLI, its trials planted from here

Nothing of the product is asked to plant anything: `use_planted_trials()` puts benchmarks/planted/ (a
`sitecustomize` module, which every Python process imports at start) and the repository root first on
PYTHONPATH, and in each trial worker (`python -m kronos_tune.benchmark.run.trial_worker --job JOB.json`)
`plant()` then wraps what the worker builds, before the worker's code runs: the trial session
(kronos_tune.benchmark.train.measure.TrialSession, its trainer's step callback) and the predict trial's
measurement (kronos_tune.benchmark.predict.measure.measure_prediction). What it plants is read from three
variables that only this module reads:

- KRONOS_TUNE_FAULT=KIND:TRIAL[,KIND:TRIAL...]: `hang` blocks the trial in its first step, as a deadlocked
  kernel or loader would (SIGTERM ignored); `hang-block` in its third paired block, `die-block` exits with an
  error there.
- KRONOS_TUNE_PLANT=TRIAL:FRACTION (the decision benchmark's planted effect): every other trial's steps are
  made that much slower, so the named trial is truly FRACTION faster per step (work, not a sleep, counted in
  the step's time). A worker whose job folder holds a `planted-delay` file (`set_delay`) takes the fraction
  from there instead, read at every step: benchmarks.decisions changes it between comparisons.
- KRONOS_TUNE_TEST_WORSEN_VAL_LOSS=TRIAL:FRACTION[:SEED] (the quality guard's planted worsening): the named
  trial's validation windows are made worse before its result is written, each window's loss times
  1 + FRACTION x (1 + z / 2), z a standard normal draw per window (seeded when SEED is given): a worsening of
  FRACTION on average with noise of its own. The measurement itself is untouched.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import run_kronos_tune

FAULT_ENV = "KRONOS_TUNE_FAULT"
PLANT_ENV = "KRONOS_TUNE_PLANT"
WORSEN_ENV = "KRONOS_TUNE_TEST_WORSEN_VAL_LOSS"
MODULE = "benchmarks.planted_trials"
REPO_ROOT = Path(__file__).resolve().parents[1]
SHIM_FOLDER = REPO_ROOT / "benchmarks" / "planted"
DELAY_FILE = "planted-delay"
FAULT_BLOCK = 3  # the paired block a hang-block / die-block fault strikes in


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


def set_delay(worker_folder: Path, fraction: float) -> None:
    """From now on the worker whose job is in `worker_folder` spends `fraction` of each step's time again (read
    at its next step)."""
    (worker_folder / DELAY_FILE).write_text(repr(fraction), encoding="utf-8")


def spin(seconds: float) -> None:
    """Keep this thread busy for `seconds` of wall time (the planted delay: work, not a sleep)."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def hang_forever() -> None:
    """Block like a deadlock: only a kill ends it."""
    while True:
        time.sleep(3600)


def _delay_reader(job_file: Path, trial: str):
    """The delay fraction of this worker's next step: its `planted-delay` file, else KRONOS_TUNE_PLANT's."""
    from_env, delay_file = planted_delay(trial), job_file.with_name(DELAY_FILE)

    def current() -> float:
        try:
            return float(delay_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return from_env

    return current


def plant() -> None:
    """In a trial worker's process, before its code runs: wrap the trial session and the predict measurement
    with what the variables plant in this trial (module docstring)."""
    argv = sys.orig_argv
    job_file = Path(argv[argv.index("--job") + 1])
    trial = json.loads(job_file.read_text(encoding="utf-8")).get("trial", "")
    kind, delay = fault(trial), _delay_reader(job_file, trial)
    from kronos_tune.benchmark.predict import measure as predict_measure
    from kronos_tune.benchmark.train import measure

    class PlantedSession(measure.TrialSession):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.blocks, self.worsened = 0, False
            if kind == "hang":
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a process stuck in a CUDA or NCCL call does
                self.on_record = lambda record: hang_forever()

        def open(self) -> None:
            super().open()
            keep = self.trainer.callback

            def slowed(record: Any) -> None:
                extra = delay() * record.step_time_s
                if extra > 0:
                    spin(extra)
                    record.step_time_s += extra
                keep(record)

            self.trainer.callback = slowed

        def block(self, count: int) -> list:
            self.blocks += 1
            if self.blocks == FAULT_BLOCK and kind == "hang-block":
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                hang_forever()
            if self.blocks == FAULT_BLOCK and kind == "die-block":
                sys.stderr.write(f"RuntimeError: injected fault: the worker died in block {self.blocks}\n")
                sys.stderr.flush()
                os._exit(3)
            return super().block(count)

        def finish(self) -> None:
            super().finish()
            if not self.worsened:
                self.worsened = True
                worsen_for_test(self.result, trial)

    measure.TrialSession = PlantedSession
    if kind == "hang":
        measured = predict_measure.measure_prediction

        def hung_prediction(settings: Any, device: Any, budget: Any, repeats: Any, emit: Any, *rest: Any) -> Any:
            return measured(settings, device, budget, repeats, lambda step: hang_forever(), *rest)

        predict_measure.measure_prediction = hung_prediction


def use_planted_trials() -> None:
    """The benchmark trials this process starts (and its children start) are planted from this module."""
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    wanted = [str(SHIM_FOLDER), str(REPO_ROOT)]
    os.environ["PYTHONPATH"] = os.pathsep.join([*wanted, *(path for path in paths if path and path not in wanted)])


def main(argv: list[str] | None = None) -> int:
    use_planted_trials()
    return run_kronos_tune(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
