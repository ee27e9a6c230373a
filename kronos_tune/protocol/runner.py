"""run_protocol: run the planned trials one by one on this machine, within the preset's memory budget.

The runner prints nothing: it calls ``on_event`` (from the running thread)
with TrialStarted / TrialStep / TrialFinished / ProtocolFinished, appends each
finished trial to OUT/results.jsonl at once, and writes the reports at the
end, also after a cancel (``cancel`` set or Ctrl-C: the trial in flight stops
at a step boundary and is recorded as cancelled; later trials are not run).
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kronos_core.errors import KronosError
from kronos_tune.errors import KronosTuneError
from kronos_tune.presets import Preset
from kronos_tune.protocol import train_trials
from kronos_tune.protocol.plan import plan_trials, resolve
from kronos_tune.protocol.predict_protocol import (
    autobatch_chunk, measure_prediction, output_max_abs_diff, series_inputs,
)
from kronos_tune.protocol.plan import BASELINE_REPEATS
from kronos_tune.protocol.quality import compute_deltas, noise_estimate, quality_threshold, timing_band
from kronos_tune.protocol.records import (
    ProtocolFinished, ProtocolOptions, ProtocolReport, Spread, TrialFinished, TrialResult, TrialSpec, TrialStarted,
    TrialStep,
)
from kronos_tune.protocol.report import RESULTS_FILE, RUN_FILE, REPORT_FILES, append_result, write_atomic, write_reports
from kronos_tune.workloads import runnable_device

EventCallback = Callable[[Any], None]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


class ProtocolRun:
    """State of one protocol run; `run()` does the work."""

    def __init__(self, preset: Preset, task: str, options: ProtocolOptions, out_dir: Path | None, resume: bool,
                 on_event: EventCallback | None, cancel: threading.Event | None) -> None:
        self.preset, self.task, self.options = preset, task, options
        self.on_event = on_event
        self.cancel = cancel if cancel is not None else threading.Event()
        self.specs = plan_trials(preset, task, options)
        self.device, device_note = runnable_device(preset)
        self.budget_bytes = options.budget_bytes or preset.budget_bytes
        self.notes = [device_note] if device_note else []
        self.results: dict[str, TrialResult] = {}
        self.previous: dict[str, TrialResult] = {}
        self.out_dir = out_dir
        self.started_at, self.started = _now(), time.perf_counter()
        self.references: dict[str, Any] = {}  # predict: the reference method's outputs
        if out_dir is not None:
            self._prepare_out_dir(out_dir, resume)
        self.budget_mode, self.device_line = self._device_line()

    # Output folder ----------------------------------------------------------------------------------
    def _prepare_out_dir(self, out: Path, resume: bool) -> None:
        try:
            out.mkdir(parents=True, exist_ok=True)
            probe = out / f".write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as error:
            raise KronosTuneError(f"--out {out}: cannot write there ({error.strerror or error}); "
                                  f"pick a folder you can write to") from None
        run_file = out / RUN_FILE
        identity = {"preset": self.preset.name, "task": self.task, "measurement": self.options.measurement_key()}
        if resume and run_file.is_file():
            stored = json.loads(run_file.read_text(encoding="utf-8"))
            if (stored.get("preset"), stored.get("task")) != (self.preset.name, self.task):
                raise KronosTuneError(f"--resume {out}: that folder holds preset '{stored.get('preset')}' task "
                                      f"'{stored.get('task')}', not preset '{self.preset.name}' task '{self.task}'; "
                                      f"use another --out")
            if stored.get("measurement") != identity["measurement"]:
                raise KronosTuneError(f"--resume {out}: it was measured with {stored.get('measurement')}; resume "
                                      f"with the same --steps/--warmup/--budget-gb/--cpu-ddp or use another --out")
            from kronos_tune.protocol.report import load_results

            self.previous = {r.name: r for r in load_results(out) if r.finished}
        elif resume:
            self.notes.append(f"--resume: {out} had no earlier run; started from the beginning")
        if not self.previous:
            for name in (RESULTS_FILE, *REPORT_FILES):
                (out / name).unlink(missing_ok=True)
        write_atomic(run_file, json.dumps({**identity, "preset_source": str(self.preset.source_path),
                                           "started_at": self.started_at}, indent=2) + "\n")

    def _device_line(self) -> tuple[str, str]:
        budget = self.budget_bytes
        if self.device == "cpu":
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
            return "simulated", (f"device: cpu ({cores} cores, {torch.get_num_threads()} threads); budget "
                                 f"{_gib(budget)} simulated (exact tensor accounting, over it fails like CUDA)")
        from kronos_tune.memory import apply_cuda_budget

        dev = torch.device("cuda", torch.cuda.current_device())
        name, total = torch.cuda.get_device_name(dev), torch.cuda.get_device_properties(dev).total_memory
        if budget < total:
            self.notes.append(apply_cuda_budget(budget, dev))
            return "memory-fraction", (f"device: {dev} {name} ({_gib(total)}); budget {_gib(budget)} via memory "
                                       f"fraction (a capped card is not identical to a small one)")
        self.notes.append(f"the budget {_gib(budget)} is not below the card's {_gib(total)}: the whole card is used")
        return "whole-card", f"device: {dev} {name} ({_gib(total)}); budget: the whole card"

    # Events and bookkeeping -----------------------------------------------------------------------
    def emit(self, event: Any) -> None:
        if self.on_event is not None:
            self.on_event(event)

    def finish(self, result: TrialResult, write: bool = True) -> None:
        self.results[result.name] = result
        if write and self.out_dir is not None:
            append_result(self.out_dir / RESULTS_FILE, result)
        self.emit(TrialFinished(result))

    def noise(self) -> float | None:
        base, probe = self.results.get("baseline"), self.results.get("noise-probe")
        if base is None or probe is None or base.status != "ok" or probe.status != "ok":
            return None
        return noise_estimate(base.val_loss, probe.val_loss)

    def band(self) -> float | None:
        """The timing noise band in percent (train: from the baseline's repeats)."""
        repeats = [self.results[name] for name in BASELINE_REPEATS if name in self.results]
        return timing_band(self.results.get(self.specs[0].name), repeats)

    def refresh_deltas(self) -> None:
        """Deltas of every result with what is known now (the band grows as baseline repeats finish)."""
        baseline, threshold, band = self.results.get(self.specs[0].name), self.threshold(), self.band()
        for result in self.results.values():
            result.deltas = compute_deltas(result, baseline, threshold, band)

    def threshold(self) -> float | None:
        base = self.results.get("baseline")
        if base is None or base.val_loss is None:
            return None
        return quality_threshold(base.val_loss, self.noise(), self.options.noise_factor, self.options.quality_floor)

    # The loop ------------------------------------------------------------------------------------
    def run(self) -> ProtocolReport:
        try:
            self._run_trials()
        except KeyboardInterrupt:  # between trials: what finished is reported
            self.cancel.set()
        finally:
            self.restore_device()
        self.refresh_deltas()
        report = self.build_report()
        if self.out_dir is not None:
            write_reports(report, self.out_dir)
        self.emit(ProtocolFinished(report))
        return report

    def _run_trials(self) -> None:
        for index, spec in enumerate(self.specs):
            if self.cancel.is_set():
                break
            if spec.stage == "combined":
                self.refresh_deltas()
            if spec.name in self.previous:
                old = self.previous[spec.name]
                old.resumed = True
                self.finish(old, write=False)
                continue
            self.finish(self.run_trial(spec, index))

    def reapply_budget(self) -> None:
        if self.device == "cuda" and self.budget_mode == "memory-fraction":
            from kronos_tune.memory import apply_cuda_budget

            apply_cuda_budget(self.budget_bytes, torch.device("cuda", torch.cuda.current_device()))

    def restore_device(self) -> None:
        if self.device == "cuda" and self.budget_mode == "memory-fraction":
            torch.cuda.set_per_process_memory_fraction(1.0, torch.cuda.current_device())

    def run_trial(self, spec: TrialSpec, index: int) -> TrialResult:
        started = time.perf_counter()
        work = Path(tempfile.mkdtemp(prefix=f"kronos-bench-{spec.name}-"))
        notes: list[str] = []

        def ended(status: str, reason: str) -> TrialResult:
            return TrialResult(spec.name, spec.stage, status, spec.changes, reason, spec.description, task=self.task)

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
        except Exception as error:  # noqa: BLE001 - a crashing trial is a result; the protocol goes on
            result = ended("failed", _one_line(error))
        finally:
            train_trials.remove_tree(work)
            gc.collect()
            if self.device == "cuda":
                torch.cuda.empty_cache()
        result.notes[:0] = notes
        result.wall_time_s = time.perf_counter() - started
        result.deltas = compute_deltas(result, self.results.get(self.specs[0].name), self.threshold(), self.band())
        return result

    def resolve(self, spec: TrialSpec, work: Path) -> tuple[TrialSpec, list[str]]:
        """Decide what is only known while running: autobatch's pick, the combination, the noise probe's data."""
        if spec.skip_reason is not None:
            return spec, []
        if self.task == "predict":
            if spec.name != "autobatch":
                return spec, []
            base = next(s for s in self.specs if s.name == "kv-cache").config
            chunk, notes = autobatch_chunk(base, self.device, self.budget_bytes, self.options.autobatch_margin)
            spec.config = dataclasses.replace(base, max_batch_size=chunk)
            spec.changes = {"use_cache": True, "max_batch_size": chunk}
            return spec, notes
        return train_trials.resolve(self, spec, work)

    def measure(self, spec: TrialSpec, work: Path) -> TrialResult:
        if self.task == "train":
            return train_trials.run_trial(self, spec, work)
        step = lambda record: self.emit(TrialStep(spec.name, record))  # noqa: E731
        m = measure_prediction(spec.config, self.device, self.budget_bytes, spec.measured_steps, step,
                               self.cancel.is_set)
        settings = spec.config
        rates = [settings.measured_series / s for s in m.seconds]
        tokens = settings.measured_series * settings.sample_count * settings.pred_len
        result = TrialResult(spec.name, spec.stage, m.status, spec.changes, m.reason, spec.description, task="predict",
                             hardware=f"{settings.devices} x {self.device}", series_per_s=Spread.of(rates),
                             tokens_per_s=Spread.of([tokens / s for s in m.seconds]),
                             peak_memory_bytes=m.peak_memory_bytes, config=settings.to_dict(),
                             warmup_time_s=m.metered_time_s, nproc=settings.devices)
        if result.series_per_s:
            result.projected_predict_time_s = settings.series_count / result.series_per_s.median
        if spec.stage == "baseline":
            self.references["outputs"] = m.outputs
        reference = self.results.get("recompute")
        if reference is not None and reference.series_per_s and result.series_per_s:
            result.speedup = result.series_per_s.median / reference.series_per_s.median
        result.output_max_abs_diff = output_max_abs_diff(m.outputs, self.references.get("outputs"),
                                                         series_inputs(settings)[0])
        return result

    # The report ----------------------------------------------------------------------------------
    def build_report(self) -> ProtocolReport:
        from kronos_tune.resource_monitor import collect_environment

        trials = [self.results[s.name] for s in self.specs if s.name in self.results]
        options = self.options.to_dict()
        if self.task == "predict" and self.specs:
            options["predict_series_used"] = self.specs[0].config.measured_series
        elif self.specs:  # what ran: train runs at least 2 warm-up steps
            by_name = {s.name: s for s in self.specs}
            options["warmup_used"] = by_name["baseline"].warmup_steps
            options["compile_warmup_used"] = by_name["compile"].warmup_steps
        report = ProtocolReport(
            preset=self.preset.name, task=self.task, device=self.device, device_line=self.device_line,
            budget_bytes=self.budget_bytes, budget_mode=self.budget_mode, trials=trials,
            planned=[s.name for s in self.specs], not_run=[s.name for s in self.specs if s.name not in self.results],
            cancelled=self.cancel.is_set(), environment=collect_environment(), options=options,
            notes=list(self.notes), preset_source=str(self.preset.source_path) if self.preset.source_path else None,
            out_dir=str(self.out_dir) if self.out_dir is not None else None, started_at=self.started_at,
            finished_at=_now(), wall_time_s=time.perf_counter() - self.started)
        if self.task == "train":
            train_trials.complete_report(self, report)
            report.timing = {"band_pct": self.band(), "sources": [n for n in BASELINE_REPEATS if n in self.results],
                             "rule": "a time or throughput delta is noise when the medians lie inside each other's "
                                     "[min, max], or when it is within band_pct: the largest difference between the "
                                     "baseline's median step time and its repeats' (noise-probe, baseline-repeat)"}
        return report


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    if isinstance(error, KronosError):
        return line
    return f"{type(error).__name__}: {line}" if line else type(error).__name__


def run_protocol(preset: Preset | str, task: str = "train", options: ProtocolOptions = ProtocolOptions(),
                 out_dir: str | os.PathLike | None = None, resume: bool = False,
                 on_event: EventCallback | None = None, cancel: threading.Event | None = None) -> ProtocolReport:
    """Run the benchmark protocol for `preset` ("train" or "predict"); see the module docstring."""
    run = ProtocolRun(resolve(preset), task, options, Path(out_dir) if out_dir is not None else None, resume,
                      on_event, cancel)
    return run.run()
