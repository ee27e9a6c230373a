"""How to run a benchmark: the options the CLI and the TUI hand the runner."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class BenchmarkOptions:
    """How to run the benchmark. Defaults size the `cpu` preset's train benchmark to a few minutes on 2 cores.

    Timing (train): each trial warms up until a step's time settles within ``settle_tolerance`` of the one
    before (at least ``warmup``, at most ``max_warmup`` steps; compile at least ``compile_warmup`` and up to
    ``max_warmup + COMPILE_EXTRA_WARMUP``), runs one metered step, then measures at least ``steps`` and at most
    ``max_steps`` steps: it stops once the median's 95 % interval is within ``target_ci`` of the median or
    ``trial_budget_s`` of measuring is spent (None: the device's default). Every trial is evaluated after the
    same optimizer step. ``drift_every``: a short baseline drift check runs after every that many single trials
    (0: none). ``trial_timeout_s``: the watchdog (None: the preset's). ``objective``: speed | memory.
    skip / only: trial names. budget_bytes overrides the preset's per-device budget. eval_windows caps the
    validation windows of the quality check. noise_factor and quality_floor set the quality guard
    (worse than baseline by more than max(noise_factor x noise, quality_floor x baseline) is flagged).
    predict_series / predict_repeats: series per timed prediction run (None: the preset's series_count) and
    timed runs; agreement_series: series the predict quality check compares (None: at least 100, or all the
    preset has); min_spearman: the ranking agreement an approximate predict setting needs.
    autobatch_estimate: search on fake tensors (None: on the CPU, where real probes are slow).
    design: how trials are timed against the baseline: auto (paired where two workers fit side by side, else
    sequential), paired, sequential. block_s: the paired design's block length in seconds (steps per block =
    block_s / the baseline's step time, at least 1); rounds: at least min_rounds, at most max_rounds, until the
    interval of the block ratios is within target_ci or trial_budget_s is spent; the A/A comparison (the
    noise-probe, whose reach is the run's resolution) at least resolution_min_rounds, for its whole budget
    (resolution_budget_s). Rounds beyond the budget that a minimum asks for stop at MAX_STRETCH x the budget.
    full: measure every trial the device can run; the default (quick) run leaves out what rarely pays on the
    device (compile and bigger-batch on a CPU; memory savers while memory does not bind) and says how to add each.
    time_to_target (also on with objective time-to-quality): after the trials, each candidate trains
    with target_seeds seeds until the baseline's validation loss at the evaluation step, within
    target_max_factor x that many steps (train/target.py).
    time_cap_s: no trial starts after this many seconds, and none runs past it (None: no cap, except
    runner.ABSENT_DEVICE_TIME_CAP_S for a preset whose device this machine lacks).
    """

    steps: int = 8
    warmup: int = 2
    compile_warmup: int = 2
    max_steps: int = 40
    max_warmup: int = 6
    settle_tolerance: float = 0.10
    target_ci: float = 0.02
    trial_budget_s: float | None = None
    drift_every: int = 3
    trial_timeout_s: float | None = None
    objective: str = "speed"
    skip: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    cpu_ddp: bool = False
    budget_bytes: int | None = None
    seed: int = 100
    eval_windows: int = 16
    noise_factor: float = 2.0
    quality_floor: float = 0.005
    predict_series: int | None = None
    predict_repeats: int = 3
    agreement_series: int | None = None
    min_spearman: float = 0.95
    autobatch_estimate: bool | None = None
    autobatch_margin: float | None = None  # None: autobatch's default for the device
    design: str = "auto"
    block_s: float = 0.5
    min_rounds: int = 10
    resolution_min_rounds: int = 10
    max_rounds: int = 200
    full: bool = False
    time_to_target: bool = False
    target_seeds: int = 3
    target_max_factor: float = 4.0
    time_cap_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["skip"], out["only"] = list(self.skip), list(self.only)
        return out

    def measurement_key(self) -> dict[str, Any]:
        """The options that change what a trial measures: a resumed run must use the same."""
        keys = ("steps", "warmup", "compile_warmup", "max_steps", "max_warmup", "target_ci", "budget_bytes", "seed",
                "eval_windows", "predict_series", "predict_repeats", "cpu_ddp", "agreement_series")
        return {key: getattr(self, key) for key in keys}
