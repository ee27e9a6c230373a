"""What the user's --skip/--only/--full select from a benchmark's trials, checked, for either task.

The tasks' own trial lists: train/trial_list.py and predict/trial_list.py.
"""

from __future__ import annotations

import importlib.util

from kronos_tune.benchmark.options import BenchmarkOptions
from kronos_tune.benchmark.results import TrialSpec
from kronos_tune.benchmark.train.decide import OBJECTIVES
from kronos_tune.errors import KronosTuneError
from kronos_tune.presets import Preset, resolve_preset

REQUIRED = ("baseline",)
LEFT_OUT = "left out of the quick run"  # the start of the reason of a trial the default run does not measure
ADD_BACK = "add it with --full, or --only {name}"
DESIGN_CHOICES = ("auto", "paired", "sequential")


def autobatch_available() -> bool:
    return importlib.util.find_spec("kronos_tune.autobatch.train_probes") is not None


def resolve(preset: Preset | str) -> Preset:
    return preset if isinstance(preset, Preset) else resolve_preset(preset)


def device_count(device: str) -> int:
    if device != "cuda":
        return 1
    import torch  # a CUDA run has torch loaded already; planning for the CPU needs none

    return torch.cuda.device_count()


def check_names(task: str, options: BenchmarkOptions, names: tuple[str, ...]) -> None:
    for flag, given in (("--skip", options.skip), ("--only", options.only)):
        for name in given:
            if name not in names:
                raise KronosTuneError(f"{flag} {name}: no such {task} trial; trials are {', '.join(names)}")
    for name in REQUIRED:
        if name in options.skip:
            raise KronosTuneError(f"--skip {name}: the {name} cannot be skipped, every delta is measured against it")
    if options.steps < 1:
        raise KronosTuneError(f"--steps {options.steps}: give at least 1 measured step")
    if options.warmup < 0 or options.compile_warmup < 0:
        raise KronosTuneError(f"--warmup {min(options.warmup, options.compile_warmup)}: give 0 or more warm-up steps")
    if options.trial_timeout_s is not None and not options.trial_timeout_s > 0:
        raise KronosTuneError(f"--trial-timeout {options.trial_timeout_s:g}: give a positive number of seconds")
    if options.trial_budget_s is not None and not options.trial_budget_s > 0:
        raise KronosTuneError(f"--trial-budget {options.trial_budget_s:g}: give a positive number of seconds")
    if options.objective not in OBJECTIVES:
        raise KronosTuneError(f"--objective {options.objective}: use one of {', '.join(OBJECTIVES)}")
    if options.design not in DESIGN_CHOICES:
        raise KronosTuneError(f"--design {options.design}: use one of {', '.join(DESIGN_CHOICES)}")
    if not options.block_s > 0:
        raise KronosTuneError(f"--block {options.block_s:g}: give a positive number of seconds per block")


def left_out(name: str, why: str) -> str:
    """The skip reason of a trial the quick (default) run leaves out, with how to add it back."""
    return f"{LEFT_OUT}: {why}; {ADD_BACK.format(name=name)}"


def quick_reason(spec: TrialSpec, options: BenchmarkOptions, device: str) -> str | None:
    """Why the default run leaves `spec` out on this device (None: it runs). --full and --only bring it back.
    Memory savers are decided once the baseline has run (train/trials.py)."""
    if options.full or spec.name in options.only or device != "cpu":
        return None
    if spec.group == "compile":
        return left_out(spec.name, "its compilation takes minutes on a CPU, a one-time cost a short finetune "
                                   "rarely earns back")
    if spec.kind is not None and spec.kind.kind == "optimization":
        return left_out(spec.name, "it changes what is trained (a larger effective batch and learning rate) and "
                                   "needs a batch search first")
    return None


def selection_reason(name: str, options: BenchmarkOptions, optional: tuple[str, ...]) -> str | None:
    """Why the user's --skip/--only leave `name` out (None when it runs)."""
    if name in options.skip:
        return "skipped by --skip"
    if options.only and name in optional and name not in options.only:
        return "not selected by --only"
    return None
