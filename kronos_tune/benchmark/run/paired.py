"""The paired, interleaved design: each comparison measured against a live baseline in alternating short blocks.

The baseline's worker is started once, warmed up once and kept alive (paused
in a read between blocks) for the whole run; every timed comparison (each
single trial, the noise-probe, the combined trial) starts its own worker and
then runs rounds of two blocks, the trial's and the baseline's, in an order
drawn from a generator seeded with the run's seed and the trial's name, once
per pair of rounds and mirrored in the second (order.trial_leads: each side
leads equally often; a periodic load cannot line up with it; the run can be
repeated).
Each round gives one ratio (the trial block's median step time over the
baseline block's); rounds are added until the interval of their centre
(stats.paired_estimate) is within ``target_ci`` or the trial's measuring
budget is spent. A change whose rounds leave its verdict open when the budget
is spent (its centre beyond the run's threshold, its interval still reaching
past 1: ``open_verdict``) is measured on once, to EXTENSION_FACTOR times the
rounds it had, and then judged on a 99% interval (stats.EXTENDED_CONFIDENCE),
which pays for the second look. The raw blocks go into results.jsonl, so
`kronos-tune report` recomputes the verdict anywhere.

Where two workers cannot live side by side (their memory does not fit the
device together, or the trial needs every device: DDP/FSDP), or when asked
(``design = "sequential"``), a comparison falls back to the sequential design
(the trial alone, against the baseline's own measurement and the drift
threshold); ``choose_design`` says which and why, and the result keeps it.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kronos_core.units import format_bytes
from kronos_tune.benchmark.run.live_worker import LiveWorker, StepHandler
from kronos_tune.benchmark.run.order import trial_leads
from kronos_tune.benchmark.results import TrialResult, TrialSpec
from kronos_tune.benchmark.task import RunContext
from kronos_tune.benchmark.stats import block_ratios, paired_estimate

MAX_BLOCK_STEPS = 50
# Rounds a minimum asks for may run past the budget (a loaded machine runs fewer rounds a second, and the
# rounds are what buy the resolution), up to this many budgets.
MAX_STRETCH = 2.5
# A change measured on (its verdict open when the budget was spent) runs to this many times the rounds it had,
# and no longer than EXTENDED_STRETCH budgets.
EXTENSION_FACTOR = 3
EXTENDED_STRETCH = 3.5
BASELINE_WORKER = "the baseline's worker"


def steps_per_block(step_time_s: float | None, block_s: float) -> int:
    """Steps in one block: about `block_s` of the baseline's steps, at least one."""
    if not step_time_s or step_time_s <= 0:
        return 1
    return max(1, min(MAX_BLOCK_STEPS, round(block_s / step_time_s)))


def memory_capacity(run: RunContext) -> tuple[int, int, str]:
    """(bytes two workers share, per-process overhead, what that is): the simulated device on the CPU, the
    card on CUDA (each process also holds a CUDA context)."""
    if run.device != "cuda":
        return run.budget_bytes, 0, "the simulated device"
    import torch

    total = int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    return total, run.preset.hardware.cuda_context_overhead_bytes, "the card"


def choose_design(run: RunContext, spec: TrialSpec, base: TrialResult | None) -> tuple[str, str]:
    """("paired" | "sequential", why) for one comparison against the baseline."""
    asked = run.options.design
    if asked == "sequential":
        return "sequential", "asked for (--design sequential)"
    if spec.nproc > 1:
        where = "core" if run.device == "cpu" else "device"
        return "sequential", (f"a {spec.nproc}-process trial needs every {where} to itself, so it cannot share the "
                              f"machine with a live baseline worker")
    if base is None or base.status != "ok":
        return "sequential", f"no baseline worker to pair with (the baseline {base.status if base else 'is missing'})"
    if asked == "paired":
        return "paired", "asked for (--design paired)"
    capacity, overhead, where = memory_capacity(run)
    peak = base.peak_memory_bytes or 0
    scale = 1.0
    if spec.config is not None and base.config and base.config.get("batch_size"):
        scale = max(1.0, spec.config.batch_size / float(base.config["batch_size"]))
    need = int(2 * overhead + peak + peak * scale)
    fits = f"about {format_bytes(need, 'GiB')} of {format_bytes(capacity, 'GiB')} ({where})"
    if need > capacity:
        return "sequential", (f"the trial's worker and a live baseline worker would need {fits}: they cannot live "
                              f"side by side, so the trial ran alone against the baseline's own measurement")
    return "paired", f"the trial's worker and a live baseline worker fit side by side ({fits})"


@dataclass
class BaselineWorkers:
    """The run's live baseline worker (started by the baseline trial, or again after one died) and whether any
    comparison of the run was sequential (then the drift checks run)."""

    worker: LiveWorker | None = None
    work: Path | None = None
    step_time_s: float | None = None
    sequential_ran: bool = False
    started: int = 0

    def start(self, run: RunContext, spec: TrialSpec, job: Callable[[Path], dict[str, Any]]) -> LiveWorker:
        """A fresh baseline worker in a folder of its own (`job` builds its job for that folder)."""
        self.close()
        self.work = Path(tempfile.mkdtemp(prefix="kronos-bench-baseline-worker-"))
        self.started += 1
        self.worker = LiveWorker(run, spec, self.work, job(self.work), who=BASELINE_WORKER)
        return self.worker

    def alive(self) -> LiveWorker | None:
        return self.worker if self.worker is not None and self.worker.alive else None

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        if self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)
            self.work = None


@dataclass
class Interleaver:
    """Rounds of a trial's block and the baseline's, in a seeded random order, until the block ratios' interval
    is tight or the budget is spent. ``blocks`` holds every finished round (also when a worker dies).
    ``whole_budget``: rounds until the budget is spent whatever the interval (the A/A comparison: its reach is the
    run's resolution, and stopping on the first tight interval would state the luckiest moment's figure).
    ``min_rounds``: at least this many rounds (None: the run's), even past the budget, up to MAX_STRETCH x it.
    ``open_verdict``: given the block ratios when the budget is spent, whether they leave the verdict open (then
    the rounds go on, once, to EXTENSION_FACTOR times as many; ``extended_after`` says after which round)."""

    run: RunContext
    name: str
    steps: int
    budget_s: float
    whole_budget: bool = False
    min_rounds: int | None = None  # None: the run's min_rounds
    open_verdict: Callable[[list[float]], bool] | None = None
    extended_after: int | None = None
    blocks: list[dict[str, Any]] = field(default_factory=list)
    stop: str = ""
    settles: list[int] = field(default_factory=list)  # rounds after which untimed blocks absorbed an evaluation
    halfwidth: float = float("inf")
    measure_time_s: float = 0.0

    @property
    def least_rounds(self) -> int:
        return self.run.options.min_rounds if self.min_rounds is None else self.min_rounds

    @property
    def order_seed(self) -> str:
        return f"{self.run.options.seed}:{self.name}"

    def measure(self, base: LiveWorker, trial: LiveWorker, on_trial_step: StepHandler | None = None) -> None:
        options = self.run.options
        leads = trial_leads(self.order_seed)
        started = time.perf_counter()
        try:
            self._rewarm(base, trial, on_trial_step)
            while True:
                if self.run.cancel.is_set():
                    self.stop = "cancelled"
                    return
                index = len(self.blocks) + 1
                first = "trial" if next(leads) else "baseline"
                times: dict[str, list[float]] = {}
                for side in (first, "baseline" if first == "trial" else "trial"):
                    if side == "trial":
                        times[side] = trial.block(self.steps, on_trial_step, index)
                    else:
                        times[side] = base.block(self.steps, None, index)
                if len(times["trial"]) < self.steps or len(times["baseline"]) < self.steps:
                    self.stop = "cancelled" if self.run.cancel.is_set() else "ended"
                    return  # a block cut short (a cancel, or out of memory): the round is not a pair
                self.blocks.append({"round": index, "first": first, "trial_s": times["trial"],
                                    "baseline_s": times["baseline"]})
                elapsed = time.perf_counter() - started
                self.halfwidth = paired_estimate(block_ratios(self.blocks)).halfwidth
                if len(self.blocks) < self.least_rounds:
                    if elapsed >= MAX_STRETCH * self.budget_s:  # a loaded machine: the minimum costs too long
                        self.stop = "time-cap"
                elif self.halfwidth <= options.target_ci and not self.whole_budget:
                    self.stop = "interval"
                elif self.extended_after is not None:
                    self.stop = self._extension_stop(elapsed)
                elif elapsed >= self.budget_s:
                    if self.open_verdict is not None and self.open_verdict(block_ratios(self.blocks)):
                        self.extended_after = len(self.blocks)
                    else:
                        self.stop = "budget"
                elif len(self.blocks) >= options.max_rounds:
                    self.stop = "max-rounds"
                if self.stop:
                    return
                if trial.evaluated_in_block or base.evaluated_in_block:
                    # the steps just after an evaluation run slow (the training iterator starts again) and
                    # would time the next block, the other side's as often as not: one untimed block a side
                    self.settles.append(index)
                    self._rewarm(base, trial, on_trial_step, after=index)
        finally:
            self.measure_time_s = time.perf_counter() - started

    def _extension_stop(self, elapsed: float) -> str:
        """Why a comparison measured on stops now ("" while it goes on)."""
        if self.extended_after is not None and len(self.blocks) >= EXTENSION_FACTOR * self.extended_after:
            return "extended"
        if elapsed >= EXTENDED_STRETCH * self.budget_s:
            return "time-cap"
        return "max-rounds" if len(self.blocks) >= self.run.options.max_rounds else ""

    def _rewarm(self, base: LiveWorker, trial: LiveWorker, on_trial_step: StepHandler | None,
                after: int | None = None) -> None:
        """One untimed block on each side: before the first round (the baseline's worker has waited while the
        trial's started, its caches and thread pool gone cold; the trial's has just run its metered step), and
        after a round in which either side evaluated."""
        for _ in range(2):  # twice only when the first untimed blocks ran the evaluation themselves
            if self.run.cancel.is_set():
                return
            trial.block(self.steps, on_trial_step, untimed_after=after)
            base.block(self.steps, None, None, untimed_after=after)
            if not (trial.evaluated_in_block or base.evaluated_in_block):
                return

    def timing(self) -> dict[str, Any]:
        """What results.jsonl keeps of how the comparison was measured (with the blocks themselves)."""
        return {"design": "paired", "rounds": len(self.blocks), "steps_per_block": self.steps, "stop": self.stop,
                "ci_halfwidth": self.halfwidth, "target_ci": self.run.options.target_ci, "budget_s": self.budget_s,
                "measure_time_s": self.measure_time_s, "whole_budget": self.whole_budget,
                "min_rounds": self.least_rounds, "settled_after": list(self.settles),
                "extended_after": self.extended_after,
                "order_seed": self.order_seed, "order": [block["first"] for block in self.blocks]}
