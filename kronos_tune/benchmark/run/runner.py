"""run_benchmark: run the planned trials one by one on this machine, within the preset's memory budget.

The runner prints nothing: it calls ``on_event`` (from the running thread)
with TrialStarted / TrialStep / TrialFinished / BenchmarkFinished, appends each
finished trial to OUT/results.jsonl at once, and writes the reports at the
end, also after a cancel (``cancel`` set, Ctrl-C or SIGTERM: the trial in
flight is asked to stop at a step boundary and killed after a short grace,
recorded as cancelled; later trials are not run; the report says partial).
Every trial runs in a process of its own, started by the shared launcher
(kronos_core.launch) under a watchdog (isolation.py): a trial past
``trial_timeout_s`` is killed with its children and recorded as ``timeout``,
its threads' stacks saved under OUT/stacks/. Each trial's steps are also
written to OUT/curves/<trial>.jsonl (kronos_tune.run_logs).
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kronos_core.errors import one_line
from kronos_core.units import format_bytes, format_duration
from kronos_tune.errors import KronosTuneError
from kronos_tune.presets import Preset, plan_command
from kronos_tune.benchmark.run.isolation import Outcome, launch_trial
from kronos_tune.benchmark.run.paired import BaselineWorkers
from kronos_tune.benchmark.tasks import get, plan_trials
from kronos_tune.benchmark.selection import resolve
from kronos_tune.benchmark.quality import noise_estimate
from kronos_tune.benchmark.events import (
    BenchmarkFinished,
    BenchmarkStarting,
    TimeEstimate,
    TrialCurves,
    TrialFinished,
    TrialStarted,
)
from kronos_tune.benchmark.results import NOISE_PROBE, BenchmarkReport, TrialResult, TrialSpec
from kronos_tune.benchmark.options import BenchmarkOptions
from kronos_tune.benchmark.results import RESULTS_FILE, append_result, load_results
from kronos_tune.benchmark.report.files import write_reports
from kronos_tune.benchmark.report.shown import summarize
from kronos_tune.runs import RunDir, claim_run_dir, default_run_dir
from kronos_tune.time_left import TimeLeft, seconds_left_by_budget
from kronos_tune.workloads import runnable_device

DEFAULT_TRIAL_TIMEOUT_S = {"cpu": 600.0, "cuda": 900.0}
# A preset whose device this machine lacks runs on the CPU at that device's memory budget: its times are not the
# card's and a GPU-sized workload can take minutes a step, so the run stops starting trials after this long.
ABSENT_DEVICE_TIME_CAP_S = 600.0

EventCallback = Callable[[Any], None]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class BenchmarkRun:
    """State of one benchmark run; `run()` does the work."""

    def __init__(self, preset: Preset, task: str, options: BenchmarkOptions, out_dir: Path | None, resume: bool,
                 on_event: EventCallback | None, cancel: threading.Event | None, overwrite: bool = False,
                 tensorboard: bool = False) -> None:
        self.preset, self.task, self.options = preset, task, options
        self.bench_task = get(task)  # the task's plan, trials, decision and report
        self.on_event = on_event
        self.cancel = cancel if cancel is not None else threading.Event()
        self.specs = plan_trials(preset, task, options)
        self.device, self.device_note = runnable_device(preset)
        self.budget_bytes = options.budget_bytes or preset.budget_bytes
        self.notes = [self.device_note] if self.device_note else []
        self.time_cap_s = options.time_cap_s or (ABSENT_DEVICE_TIME_CAP_S if self.device_note else None)
        self.capped: list[str] = []  # the trials the time cap left out
        self.measured = 0  # the trials this invocation ran (not skipped, not resumed)
        self.measured_budget_s = 0.0  # the measuring budgets of those trials
        self.time_left = TimeLeft(time.perf_counter)  # started again at the first trial
        self.results: dict[str, TrialResult] = {}
        self.previous: dict[str, TrialResult] = {}
        self.started_at, self.started = _now(), time.perf_counter()
        self.references: dict[str, Any] = {}  # predict: the reference method's outputs
        self.paired = BaselineWorkers()  # train: the live baseline worker the comparisons are paired with
        self.setup_costs: dict[str, dict[str, float]] = {}
        self.trial_timeout_s = (options.trial_timeout_s or preset.benchmark.trial_timeout_s
                                or preset.workload.trial_timeout_s
                                or DEFAULT_TRIAL_TIMEOUT_S.get(self.device, 900.0))
        if self.time_cap_s is not None:
            self.trial_timeout_s = min(self.trial_timeout_s, self.time_cap_s)
        if out_dir is None:
            out_dir = default_run_dir("benchmark", f"{preset.name}-{task}")
        self.out_dir = out_dir
        self.run_dir = self._claim(out_dir, resume, overwrite)
        self.job = self._user_job(out_dir)
        self.curves = TrialCurves(out_dir, tensorboard)  # OUT/curves/<trial>.jsonl (+ OUT/tensorboard/<trial>/)
        self.budget_mode, self.device_line = self._device_line()
        self.run_dir.mark("running", **self._run_facts())

    # Output folder ----------------------------------------------------------------------------------
    def _claim(self, out: Path, resume: bool, overwrite: bool) -> RunDir:
        identity = {"preset": self.preset.name, "task": self.task, "measurement": self.options.measurement_key()}
        if resume and not (out / "run.json").is_file():
            if out.is_dir() and any(out.iterdir()):
                raise KronosTuneError(f"--resume {out}: not a kronos-tune run (no run.json); give the folder a "
                                      f"benchmark printed when it started")
            self.notes.append(f"--resume: {out} had no earlier run; started from the beginning")
            resume = False
        try:
            run_dir = claim_run_dir(out, "benchmark", identity, resume=resume, overwrite=overwrite,
                                    same=("preset", "task"))
        except KronosTuneError:
            raise
        if run_dir.resumed:
            stored = (run_dir.previous or {}).get("identity", {}).get("measurement")
            if stored is not None and stored != identity["measurement"]:
                raise KronosTuneError(f"--resume {out}: it was measured with {stored}; resume with the same "
                                      f"--steps/--warmup/--budget-gb/--cpu-ddp or use another --out")
            self.previous = {r.name: r for r in load_results(out) if r.finished}
        return run_dir

    def _user_job(self, out: Path) -> dict[str, Any] | None:
        """`benchmark --config`: the user's data read once into OUT/data, which every trial's config reads;
        what report.json says of the job (its file, data, windows)."""
        job = self.preset.job
        if job is None:
            return None
        if job.get("task") == "predict":
            return self._user_predict_job(out, job)
        from kronos_tune.benchmark.user_job import SAVED_DATA, as_saved, save_data

        saved = out / SAVED_DATA
        if not (self.run_dir.resumed and saved.is_dir()):
            saved = save_data(self.preset, out)
        for spec in self.specs:
            if spec.config is not None:
                spec.config = spec.config.replace(**as_saved({}, saved))
        return {key: job[key] for key in ("source", "phase", "data", "windows", "upstream")} | {
            "saved_data": str(saved), "lookback_window": self.preset.workload.lookback_window,
            "predict_window": self.preset.workload.predict_window, "values": job["values"],
            "shared": job["shared"], "phases": job["phases"], "sources": job["sources"]}

    def _user_predict_job(self, out: Path, job: dict[str, Any]) -> dict[str, Any]:
        """The user's series read once into OUT/data/series.npz (kept on --resume); every trial opens it."""
        from kronos_tune.benchmark.user_job import SAVED_DATA, SAVED_SERIES, save_predict_series

        configs = [spec for spec in self.specs if spec.config is not None]
        saved = out / SAVED_DATA / SAVED_SERIES
        if configs and not (self.run_dir.resumed and saved.is_file()):
            saved = save_predict_series(configs[0].config, self.device, out)
        for spec in configs:
            spec.config = dataclasses.replace(spec.config, inputs={**spec.config.inputs, "saved": str(saved)})
        return {key: job[key] for key in ("task", "source", "data", "series", "values")} | {
            "lookback": self.preset.predict.lookback, "pred_len": self.preset.predict.pred_len,
            "saved_data": str(saved)}

    def _run_facts(self) -> dict[str, Any]:
        """What `kronos-tune report` needs to rebuild the report on another machine."""
        return {"preset_source": str(self.preset.source_path) if self.preset.source_path else None,
                "started_at": self.started_at, "device": self.device, "device_line": self.device_line,
                "budget_bytes": self.budget_bytes, "budget_mode": self.budget_mode,
                "options": self.options.to_dict(), "planned": [s.name for s in self.specs],
                "trial_timeout_s": self.trial_timeout_s, "job": self.job}

    def stack_file(self, trial: str) -> Path:
        folder = self.out_dir / "stacks"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{trial}.txt"

    def launch(self, spec: TrialSpec, work: Path, job: dict[str, Any],
               on_event: Callable[[dict[str, Any]], None],
               deadline: Callable[[], float | None] | None = None) -> tuple[Outcome, Path]:
        """Run `job` in trial_worker processes (torchrun for spec.nproc > 1) through the shared launcher, under
        the watchdog (the trial timeout, or `deadline` for a serving worker); `on_event` gets its events."""
        processes = spec.nproc if job.get("kind") != "predict" else 1  # predict shards through its own launch
        stack_file = self.stack_file(spec.name)
        timeout = self.trial_timeout_s
        if self.time_cap_s is not None:  # a trial started near the cap still ends by it (30 s to start up)
            timeout = min(timeout, max(30.0, self.time_cap_s - (time.perf_counter() - self.started)))
        outcome = launch_trial(spec.name, processes, work, job, on_event, self.cancel, timeout, stack_file, deadline)
        return outcome, stack_file

    def _device_line(self) -> tuple[str, str]:
        budget = self.budget_bytes
        budget_text = format_bytes(budget, "GiB", 1)
        if self.device == "cpu":
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
            return "simulated", (f"device: cpu ({cores} cores, {torch.get_num_threads()} threads); budget "
                                 f"{budget_text} simulated (exact tensor accounting, over it fails like CUDA)")
        from kronos_tune.memory import apply_cuda_budget

        dev = torch.device("cuda", torch.cuda.current_device())
        name, total = torch.cuda.get_device_name(dev), torch.cuda.get_device_properties(dev).total_memory
        total_text = format_bytes(total, "GiB", 1)
        if budget < total:
            if self.bench_task.probes_in_process:
                self.notes.append(apply_cuda_budget(budget, dev))
            else:
                self.notes.append(f"each trial's process caps {dev} at {budget_text} of {total_text} via "
                                  f"set_per_process_memory_fraction (reserved memory only: the CUDA context and "
                                  f"cuBLAS workspaces are outside it; a capped large card still differs from a "
                                  f"small one, so treat the result as an approximation)")
            return "memory-fraction", (f"device: {dev} {name} ({total_text}); budget {budget_text} via memory "
                                       f"fraction (a capped card is not identical to a small one)")
        self.notes.append(f"the budget {budget_text} is not below the card's {total_text}: the whole card is used")
        return "whole-card", f"device: {dev} {name} ({total_text}); budget: the whole card"

    # Events and bookkeeping -----------------------------------------------------------------------
    def emit(self, event: Any) -> None:
        self.curves.on_event(event)
        if self.on_event is not None:
            self.on_event(event)

    def finish(self, result: TrialResult, write: bool = True, index: int | None = None) -> None:
        self.results[result.name] = result
        if write:
            append_result(self.out_dir / RESULTS_FILE, result)
        self.emit(TrialFinished(result))
        if write and result.status != "skipped":
            self.measured += 1
            self.measured_budget_s += self._budget_of(result)
        if index is not None and not self.cancel.is_set():
            self.emit(self.estimate(index + 1))

    # What the run will do, and how long it takes --------------------------------------------------
    def likely(self, start: int) -> list[TrialSpec]:
        """The trials from `start` on that are likely to run (what the task can tell before resolving them)."""
        return [spec for spec in self.specs[start:]
                if spec.name not in self.previous and self.bench_task.will_run(self, spec)]

    def _budget_s(self, spec: TrialSpec) -> float:
        return self.bench_task.measuring_budget_s(self, spec) or 0.0

    def _budget_of(self, result: TrialResult) -> float:
        """The measuring budget a finished trial had (its own record of it, else its spec's)."""
        recorded = (result.timing or {}).get("budget_s")
        if isinstance(recorded, (int, float)):
            return float(recorded)
        spec = next((s for s in self.specs if s.name == result.name), None)
        return 0.0 if spec is None else self._budget_s(spec)

    def estimate(self, start: int) -> TimeEstimate:
        """The time the trials from `start` on take: each its measuring budget plus the start-up and warm-up
        the trials this invocation ran took beyond theirs (the A/A comparison's budget is four times a
        change's, so a mean wall time per trial would be off by the order the trials run in)."""
        left = self.likely(start)
        figure = seconds_left_by_budget(self.measured, self.time_left.elapsed(), self.measured_budget_s,
                                        [self._budget_s(spec) for spec in left])
        return TimeEstimate(len(left), self.time_left.expect(figure), self._cap_left())

    def _cap_left(self) -> float | None:
        return None if self.time_cap_s is None else max(0.0, self.time_cap_s - (time.perf_counter() - self.started))

    def starting(self) -> BenchmarkStarting:
        likely = self.likely(0)
        return BenchmarkStarting(
            preset=self.preset.name, task=self.task, trials=tuple(s.name for s in likely),
            planned=len(self.specs), resumed=len(self.previous), device_line=self.device_line,
            device_note=self.device_note, budget_bytes=self.budget_bytes,
            measuring_s=sum(self.bench_task.measuring_budget_s(self, spec) or 0.0 for spec in likely),
            time_cap_s=self.time_cap_s, out_dir=str(self.out_dir), plan_command=plan_command(self.preset))

    def noise(self) -> float | None:
        base, probe = self.results.get("baseline"), self.results.get(NOISE_PROBE)
        if base is None or probe is None or base.status != "ok" or probe.status != "ok":
            return None
        return noise_estimate(base.val_loss, probe.val_loss)

    # The loop ------------------------------------------------------------------------------------
    def run(self) -> BenchmarkReport:
        try:
            self._run_trials()
        except KeyboardInterrupt:  # between trials: what finished is reported
            self.cancel.set()
        finally:
            self.paired.close()
            self.curves.close()
            self.restore_device()
        report = self.build_report()
        write_reports(report, self.out_dir)
        status = "cancelled" if report.cancelled else "partial" if report.partial else "complete"
        self.run_dir.mark(status, **self._run_facts(), finished_at=report.finished_at, missing=report.missing)
        self.emit(BenchmarkFinished(report))
        return report

    def _run_trials(self) -> None:
        self.emit(self.starting())
        self.time_left.start()
        for index, spec in enumerate(self.specs):
            if self.cancel.is_set():
                break
            if spec.name in self.previous:
                old = self.previous[spec.name]
                old.resumed = True
                self.finish(old, write=False)
                continue
            if self.time_cap_s is not None and self._cap_left() == 0.0 and spec.skip_reason is None:
                self.capped = [s.name for s in self.specs[index:] if s.name not in self.previous]
                break
            self.finish(self.run_trial(spec, index), index=index)
        if not self.cancel.is_set() and not self.capped:
            for result in self.bench_task.after_trials(self):  # kept again: the last line of a name wins
                self.results[result.name] = result
                append_result(self.out_dir / RESULTS_FILE, result)

    def reapply_budget(self) -> None:
        if self.device == "cuda" and self.budget_mode == "memory-fraction" and self.bench_task.probes_in_process:
            from kronos_tune.memory import apply_cuda_budget

            apply_cuda_budget(self.budget_bytes, torch.device("cuda", torch.cuda.current_device()))

    def restore_device(self) -> None:
        if self.device == "cuda" and self.budget_mode == "memory-fraction" and self.bench_task.probes_in_process:
            torch.cuda.set_per_process_memory_fraction(1.0, torch.cuda.current_device())

    def run_trial(self, spec: TrialSpec, index: int) -> TrialResult:
        started = time.perf_counter()
        work = Path(tempfile.mkdtemp(prefix=f"kronos-bench-{spec.name}-"))
        notes: list[str] = []

        def ended(status: str, reason: str) -> TrialResult:
            result = TrialResult(spec.name, spec.stage, status, spec.changes, reason, spec.description,
                                 task=self.task)
            result.set_kind(spec.kind)
            return result

        try:
            try:
                spec, notes = self.resolve(spec, work)
            finally:
                if spec.name == "autobatch":
                    self.reapply_budget()  # autobatch's own GPU probes lift the memory-fraction cap when done
            if spec.skip_reason is not None:
                result = ended("skipped", spec.skip_reason)
            else:
                self.emit(TrialStarted(spec, index, len(self.specs)))
                result = self.measure(spec, work)
        except KeyboardInterrupt:
            self.cancel.set()
            result = ended("cancelled", "interrupted (Ctrl-C)")
        except Exception as error:  # noqa: BLE001 - a crashing trial is a result; the benchmark goes on
            result = ended("failed", one_line(error))
        finally:
            shutil.rmtree(work, ignore_errors=True)
            gc.collect()
            if self.device == "cuda":
                torch.cuda.empty_cache()
        result.notes[:0] = notes
        result.wall_time_s = time.perf_counter() - started
        if result.kind is None:
            result.set_kind(spec.kind)
        return result

    def resolve(self, spec: TrialSpec, work: Path) -> tuple[TrialSpec, list[str]]:
        """Decide what is only known while running: autobatch's pick, the combination, the noise probe's data."""
        if spec.skip_reason is not None:
            return spec, []
        return self.bench_task.resolve(self, spec, work)

    def measure(self, spec: TrialSpec, work: Path) -> TrialResult:
        return self.bench_task.run_trial(self, spec, work)

    # The report ----------------------------------------------------------------------------------
    def build_report(self) -> BenchmarkReport:
        from kronos_tune.telemetry.resource_monitor import collect_environment

        trials = [self.results[s.name] for s in self.specs if s.name in self.results]
        not_run = [s.name for s in self.specs if s.name not in self.results]
        # a cancel that arrives after the last trial finished stops nothing: the run is complete, not cancelled
        stopped = self.cancel.is_set() and (bool(not_run) or any(t.status == "cancelled" for t in trials))
        options = {**self.options.to_dict(), **self.bench_task.report_options(self.specs)}
        options["trial_timeout_s"] = self.trial_timeout_s
        report = BenchmarkReport(
            preset=self.preset.name, task=self.task, device=self.device, device_line=self.device_line,
            budget_bytes=self.budget_bytes, budget_mode=self.budget_mode, trials=trials,
            planned=[s.name for s in self.specs], not_run=not_run, cancelled=stopped,
            environment=collect_environment(), options=options,
            notes=list(self.notes), preset_source=str(self.preset.source_path) if self.preset.source_path else None,
            out_dir=str(self.out_dir), started_at=self.started_at, finished_at=_now(),
            wall_time_s=time.perf_counter() - self.started, job=self.job)
        if self.capped:
            report.notes.append(self.cap_note())
        timing = self.time_left.first_vs_actual()
        if timing is not None and not stopped and not self.capped:
            report.notes.append(f"run time: {timing} (the first estimate came after the first trial measured)")
        return summarize(report, self.preset)

    def cap_note(self) -> str:
        assert self.time_cap_s is not None
        card = f"; for what fits on the preset's card, without running it: {plan_command(self.preset)}" \
            if self.device_note else ""
        return (f"time cap of {format_duration(self.time_cap_s)} reached: not run: {', '.join(self.capped)} "
                f"(--time-cap SECONDS sets it){card}")


def run_benchmark(preset: Preset | str, task: str = "train", options: BenchmarkOptions = BenchmarkOptions(),
                 out_dir: str | os.PathLike | None = None, resume: bool = False,
                 on_event: EventCallback | None = None, cancel: threading.Event | None = None,
                 overwrite: bool = False, tensorboard: bool = False) -> BenchmarkReport:
    """Run the benchmark for `preset` ("train" or "predict"); see the module docstring. Each trial's
    curve (step times, losses) goes to OUT/curves/<trial>.jsonl, and with `tensorboard` to OUT/tensorboard/<trial>/.

    `out_dir` None: a fresh folder runs/benchmark/<preset>-<task>-<time>/ under the current directory. An
    existing run folder is only continued with `resume` or replaced with `overwrite`."""
    run = BenchmarkRun(resolve(preset), task, options, Path(out_dir) if out_dir is not None else None, resume,
                      on_event, cancel, overwrite, tensorboard)
    return run.run()
