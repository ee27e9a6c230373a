"""Time to target: how long each candidate trains until it reaches the baseline's validation loss.

A change can make steps faster and learning slower (a bigger batch, a lower precision), so time per step is not
the whole answer. With ``--time-to-target`` (or ``--objective time-to-quality``; never in the quick run) the benchmark
ends with a comparison as DAWNBench and MLPerf make one: the target is the baseline's validation loss after the
evaluation step N of the benchmark (on the same windows), and each candidate (the baseline, every single change
that passed the quality guard, the combination) trains from scratch with ``target_seeds`` seeds (3 by default:
other initial weights and another order of the windows) until its validation loss is at or under the target,
or until ``target_max_factor`` x N steps. Its time to target is the sum of its optimizer steps' times (the
evaluations between them, the same for every candidate, are not counted), reported as the median with its
spread over the seeds; a seed that did not reach the target within the budget counts as not reached.

With ``--objective time-to-quality`` the recommendation is the candidate with the lowest median time to target
among those that reached it with every seed and whose slowest seed beat the baseline's fastest one (ranges that
do not overlap: with three seeds no finer claim is honest); otherwise the baseline is kept.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kronos_tune.benchmark.results import TrialResult, TrialSpec

if TYPE_CHECKING:
    from kronos_tune.benchmark.task import RunContext

CHECKS_PER_TARGET = 8  # evaluations before step N: the time to target is known to within N / 8 steps


@dataclass(frozen=True)
class SeedRun:
    """One seed's run towards the target."""

    seed: int
    reached: bool
    seconds: float  # the optimizer steps' time until the target was reached (or the budget spent)
    steps: int
    val_loss: float | None  # the last evaluation's

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TimeToTarget:
    """A candidate's time to the target over its seeds."""

    target: float
    target_step: int
    max_steps: int
    runs: list[SeedRun] = field(default_factory=list)

    @property
    def reached_all(self) -> bool:
        return bool(self.runs) and all(run.reached for run in self.runs)

    @property
    def seconds(self) -> list[float]:
        return [run.seconds for run in self.runs if run.reached]

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.seconds) if self.reached_all else None

    def text(self) -> str:
        reached = sum(run.reached for run in self.runs)
        if not self.reached_all:
            return f"target reached by {reached} of {len(self.runs)} seeds within {self.max_steps} steps"
        low, high = min(self.seconds), max(self.seconds)
        steps = sorted(run.steps for run in self.runs)
        return (f"{self.median_s:.1f} s to target (seeds {low:.1f}–{high:.1f} s, n={len(self.runs)}; "
                f"{steps[0]}–{steps[-1]} steps)")

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "target_step": self.target_step, "max_steps": self.max_steps,
                "runs": [run.to_dict() for run in self.runs], "median_s": self.median_s,
                "reached_all": self.reached_all, "text": self.text()}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> TimeToTarget | None:
        if not data:
            return None
        return cls(data["target"], data["target_step"], data["max_steps"],
                   [SeedRun(**{k: run[k] for k in ("seed", "reached", "seconds", "steps", "val_loss")})
                    for run in data.get("runs") or []])


def wanted(options: Any) -> bool:
    """Whether the run ends with the time-to-target comparison: asked for, or the objective."""
    return bool(options.time_to_target or options.objective == "time-to-quality")


# Deciding ------------------------------------------------------------------------------------------------

def recommend_by_target(results: list[TrialResult], baseline: str = "baseline") -> tuple[str, str]:
    """The time-to-quality recommendation (module docstring) and why, in one sentence."""
    measured = {r.name: TimeToTarget.from_dict(r.time_to_target) for r in results if r.time_to_target}
    base = measured.get(baseline)
    if base is None or not base.reached_all:
        why = "no time to target was measured" if base is None else f"the baseline's {base.text()}"
        return baseline, f"kept the baseline: {why}, so no change can be called faster to the target"
    floor = min(base.seconds)
    faster = {name: t for name, t in measured.items() if name != baseline and t.reached_all and max(t.seconds) < floor}
    if not faster:
        return baseline, (f"no change reached the baseline's val loss at step {base.target_step} "
                          f"({base.target:.4f}) faster with every seed than the baseline's fastest seed "
                          f"(baseline: {base.text()})")
    name = min(faster, key=lambda n: faster[n].median_s or float("inf"))
    return name, (f"{name} reaches the baseline's val loss at step {base.target_step} ({base.target:.4f}) fastest: "
                  f"{faster[name].text()}, against the baseline's {base.text()}; each of its seeds beat the "
                  f"baseline's fastest")


def summary_lines(results: list[TrialResult]) -> list[str]:
    """One line per candidate measured, for the report and the terminal."""
    return [f"{r.name}: {TimeToTarget.from_dict(r.time_to_target).text()}" for r in results if r.time_to_target]


# Running -------------------------------------------------------------------------------------------------

def candidates(run: RunContext) -> list[TrialResult]:
    """The baseline, the single changes that ran ok and passed the guard, and the combination."""
    chosen = []
    for result in run.results.values():
        if result.status != "ok" or result.val_loss_step is None or result.time_to_target is not None:
            continue
        if result.stage == "baseline" and result.name != "baseline":
            continue
        if result.stage in ("single", "combined") and not result.quality_passed:
            continue
        if result.stage in ("baseline", "single", "combined") and result.config:
            chosen.append(result)
    return chosen


def measure_candidates(run: RunContext) -> list[TrialResult]:
    """Each candidate's time to target, measured (`target_seeds` runs each, in their own worker processes);
    returns the results it was added to."""
    base = run.results.get("baseline")
    if base is None or base.status != "ok" or base.val_loss is None or base.val_loss_step is None:
        return []
    max_steps = max(base.val_loss_step + 1, round(run.options.target_max_factor * base.val_loss_step))
    done = []
    for result in candidates(run):
        if run.cancel.is_set():
            break
        runs = []
        for offset in range(max(1, run.options.target_seeds)):
            seed = int(result.config.get("seed", 0)) + 1000 + offset
            spec = TrialSpec(f"{result.name}-target-{offset}", "single", {}, None, nproc=result.nproc)
            work = Path(tempfile.mkdtemp(prefix=f"kronos-target-{result.name}-"))
            job = {"kind": "time-to-target", "config": {**result.config, "seed": seed,
                                                          "output_dir": str(work / "run")},
                   "target": base.val_loss, "target_step": base.val_loss_step, "max_steps": max_steps,
                   "result_file": str(work / "target.json")}
            outcome, _ = run.launch(spec, work, job, lambda event: None)
            found = work / "target.json"
            if outcome.cancelled or not found.is_file():
                break
            runs.append(SeedRun(**json.loads(found.read_text(encoding="utf-8"))))
        if runs:
            result.time_to_target = TimeToTarget(base.val_loss, base.val_loss_step, max_steps, runs).to_dict()
            done.append(result)
    return done


def train_to_target(config: Any, target: float, target_step: int, max_steps: int,
                    should_stop: Any = lambda: False) -> SeedRun:
    """In a worker: train `config` until its validation loss is at or under `target` (evaluated every
    N / CHECKS_PER_TARGET steps) or `max_steps` ran; the clock counts the optimizer steps only."""
    from kronos_core.train import Trainer

    every = max(1, target_step // CHECKS_PER_TARGET)
    times: list[float] = []  # the trainer's own step times (CUDA synchronized at the phase boundaries)
    loss = None
    with Trainer(config, callback=lambda record: times.append(record.step_time_s)) as trainer:
        while trainer.step < max_steps and not should_stop():
            trainer.train_step()
            if trainer.step % every == 0 or trainer.step == max_steps:
                loss = float(trainer.evaluate()["val_loss"])
                if loss <= target:
                    return SeedRun(config.seed, True, sum(times), trainer.step, loss)
        return SeedRun(config.seed, False, sum(times), trainer.step, loss)
