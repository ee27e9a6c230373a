"""The dashboard App: composes the panels, starts jobs in worker threads, routes their messages to widgets."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import events, on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer

from kronos_core.cpu_features import CpuFeatures, detect_cpu_features
from kronos_core.errors import KronosError, one_line
from kronos_tune.presets import Preset, list_presets, resolve_preset
from kronos_tune.runs import default_run_dir
from kronos_tune.telemetry.sampler import Sampler
from kronos_tune.tui import jobs
from kronos_tune.tui.model import Answer, ResultsModel, RunState, TelemetryHistory
from kronos_tune.tui.format import gib
from kronos_tune.tui.keys import bindings, help_rows, palette_entries
from kronos_tune.tui.jobs import JobFinished, JobNote, LogLine, BenchmarkEvent, TelemetryUpdated, TrainingStep
from kronos_tune.tui.results_view import ResultsView
from kronos_tune.tui.screens import HelpScreen, PresetPicker, TooSmallScreen, too_small
from kronos_tune.tui.widgets import (
    AnswerPanel, GpuPanel, HostPanel, LogPane, NoGpuPanel, ResultsTable, RunPanel, StatusBar, columns,
)

if TYPE_CHECKING:  # the benchmark imports torch: loaded when the first job needs it, not at start-up
    from kronos_tune.benchmark import BenchmarkOptions, BenchmarkReport

PALETTE_IN_FOOTER_WIDTH = 100


class DashboardApp(ResultsView, App[int]):
    """`kronos-tune dashboard`: live telemetry, the benchmark, autobatch and training in one screen."""

    CSS_PATH = "styles.tcss"
    TITLE = "kronos-tune dashboard"
    BINDINGS = bindings()

    def __init__(self, preset: Preset | None = None, preset_dirs: list[Path] | None = None,
                 sampler: Sampler | None = None, out_dir: Path = Path("runs"),
                 benchmark_options: BenchmarkOptions | None = None, cpu: CpuFeatures | None = None) -> None:
        """`sampler`: started on mount and stopped on quit (None: telemetry arrives as TelemetryUpdated
        messages posted by the caller, as the snapshot tests do). `benchmark_options`: BenchmarkOptions for
        every benchmark (None: the benchmark's defaults). `cpu`: the CPU the header names (None: this machine's,
        kronos_core.cpu_features; the snapshot tests pass a fixed one). `out_dir`: the root of the run folders
        (OUT/benchmark/<preset>-<task>-<time>/, OUT/train/<preset>-<time>/, OUT/exports/...): one per run."""
        super().__init__()
        self.preset = preset
        self.preset_dirs = list(preset_dirs or [])
        self.sampler = sampler
        self.out_dir = Path(out_dir)
        self.benchmark_options = benchmark_options
        self.host_label = socket.gethostname()
        self.cpu = cpu or detect_cpu_features()
        self.telemetry = TelemetryHistory()
        self.run_state = RunState()
        self.results_task = "train"
        self.results = ResultsModel(columns(self.results_task))
        self.paused = False
        self.report: BenchmarkReport | None = None  # the last benchmark's report (also a cancelled one)
        self.complete: dict[str, BenchmarkReport] = {}  # per task: the last complete report of this preset
        self.answer: Answer | None = None  # what the recommendation panel shows
        self.recommended: Path | None = None  # recommended.toml behind the answer (train task)
        self._cancel = threading.Event()
        self._job_done = threading.Event()
        self._job_done.set()
        self._quitting = False
        self.folders: list[Path] = []  # every run folder this session started, for the line `q` leaves behind
        self._unsubscribe: Callable[[], None] | None = None
        self._gpu_indices: tuple[int, ...] | None = None

    # -- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusBar()
        with Horizontal(id="telemetry"):
            yield VerticalScroll(id="gpus")
            yield HostPanel()
        with Horizontal(id="middle"):
            yield RunPanel()
            yield LogPane()
        yield AnswerPanel()
        yield ResultsTable()
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self._show_status()
        self._show_results()
        self.query_one(ResultsTable).focus()  # arrow keys and PgUp/PgDn scroll the results at once
        self._fit_results()
        self._fit_footer(self.size.width)
        if self.preset is None:
            self.log_line("no preset: press p to pick one", "warning")
        else:
            self.log_line(f"preset {self.preset.name}: {self.preset.description}")
        if self.sampler is not None:
            self._unsubscribe = self.sampler.subscribe(lambda snapshot: self.post_message(TelemetryUpdated(snapshot)))
            self.sampler.start()
            self.log_line(f"telemetry every {self.sampler.interval_s:g} s")
        self._check_size(self.size.width, self.size.height)

    def on_resize(self, event: events.Resize) -> None:
        self._check_size(event.size.width, event.size.height)
        self._fit_results(event.size)
        self._fit_footer(event.size.width)

    def _fit_footer(self, width: int) -> None:
        """Below 100 columns the footer leaves out the command palette's ^p (the help lists it): the keys it
        names, tab for the next pane included, then fit in 80."""
        footer = self.query_one(Footer)
        wide = width >= PALETTE_IN_FOOTER_WIDTH
        if footer.show_command_palette != wide:
            footer.show_command_palette = wide
            footer.refresh(recompose=True)

    def on_descendant_focus(self) -> None:
        self._fit_results()  # the recommendation takes more rows while it has the focus

    def _check_size(self, width: int, height: int) -> None:
        small = too_small(width, height)
        if small and not isinstance(self.screen, TooSmallScreen):
            self.push_screen(TooSmallScreen())
        elif not small and isinstance(self.screen, TooSmallScreen):
            self.pop_screen()

    # -- the palette ----------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for title, text, action in palette_entries():
            yield SystemCommand(title, text, lambda action=action: self.run_action(action))

    # -- small helpers --------------------------------------------------------------------
    def log_line(self, text: str, level: str = "info") -> None:
        self.query_one(LogPane).add(text, level, time.strftime("%H:%M:%S"))

    @property
    def busy(self) -> bool:
        return not self._job_done.is_set()

    def _budget_text(self) -> str | None:
        if self.preset is None:
            return None
        hw = self.preset.hardware
        return f"{gib(self.preset.budget_bytes)} × {hw.device_count} (preset {self.preset.name})"

    def _show_status(self) -> None:
        latest = self.telemetry.latest
        if latest is None:
            devices = "…"
        elif latest.gpus:
            names = {gpu.name or "GPU" for gpu in latest.gpus}
            devices = f"{len(latest.gpus)}× {', '.join(sorted(names))}"
        else:
            devices = f"no NVIDIA GPU · {len(latest.host.cpu_percent_per_core)} CPU cores"
        preset = f"preset {self.preset.name}" if self.preset else "no preset (p)"
        run = self.run_state
        state = run.phase if run.job is None else f"{run.job}: {run.phase}"
        if self.paused:
            state += " · paused"
        style = {"running": "green", "cancelling": "yellow", "failed": "red"}.get(run.phase, "")
        self.query_one(StatusBar).show(self.host_label, devices, preset, state, style, self.cpu.brief())

    # -- telemetry ------------------------------------------------------------------------
    def on_telemetry_updated(self, message: TelemetryUpdated) -> None:
        first = self.telemetry.latest is None
        self.telemetry.add(message.snapshot)
        if first:
            self._show_status()
        if not self.paused:
            self._show_telemetry()

    def _show_telemetry(self) -> None:
        snapshot = self.telemetry.latest
        if snapshot is None:
            return
        history = self.telemetry
        indices = tuple(gpu.index for gpu in snapshot.gpus)
        container = self.query_one("#gpus", VerticalScroll)
        if indices != self._gpu_indices:
            self._gpu_indices = indices
            container.remove_children()
            container.mount_all([GpuPanel(index) for index in indices] if indices else [NoGpuPanel()])
            self.query_one("#telemetry").set_class(not indices, "no-gpu")  # a narrow panel without GPUs
            self.call_after_refresh(self._show_telemetry)
            return
        if indices:
            for gpu in snapshot.gpus:
                container.query_one(f"#gpu-{gpu.index}", GpuPanel).show(
                    gpu, history.series(f"gpu{gpu.index}.memory"), history.series(f"gpu{gpu.index}.util"))
        else:
            container.query_one(NoGpuPanel).show(snapshot.gpu_unavailable_reason, self._budget_text())
        self.query_one(HostPanel).show(snapshot.host, history.series("ram"), history.series("cpu"),
                                       history.series("rss"))

    # -- job plumbing ---------------------------------------------------------------------
    def _start_job(self, job: str) -> Preset | None:
        """The preset to run `job` on, with the run state reset; None (and a log line why) while another
        run is going or without a preset."""
        if self._quitting:
            return None
        if self.busy:
            self.log_line(f"{self.run_state.job} is still running: wait for it or cancel it (c) first", "warning")
            return None
        if self.preset is None:
            self.log_line("no preset: pick one first (p)", "warning")
            return None
        self._cancel = threading.Event()
        self._job_done.clear()
        self.run_state.begin(job)
        self.log_line(f"{job} started on preset {self.preset.name}")
        self._show_run()
        return self.preset

    def _show_run(self) -> None:
        if not self.paused:
            self.query_one(RunPanel).show(self.run_state)
        self._show_status()

    @work(thread=True, exclusive=True, group="job", exit_on_error=False)
    def _run_job(self, body: Callable[..., None], *args: Any) -> None:
        """Run one of kronos_tune.tui.jobs in a worker thread; it reports through (thread-safe) post_message."""
        try:
            body(self.post_message, *args)
        finally:
            self._job_done.set()

    def on_log_line(self, message: LogLine) -> None:
        self.log_line(message.text, message.level)

    def on_benchmark_event(self, message: BenchmarkEvent) -> None:
        from kronos_tune.benchmark import PredictStep, BenchmarkFinished, TrialFinished, TrialStarted, TrialStep

        event = message.event
        run = self.run_state
        if isinstance(event, TrialStarted):
            spec = event.spec
            run.begin_trial(spec.name, event.index + 1, event.total, spec.total_steps or None,
                            open_count=run.job == "benchmark train")  # measured until the timing settles
            self.log_line(f"trial {event.index + 1}/{event.total}: {spec.name} ({spec.stage})"
                          + (f": {spec.description}" if spec.description else ""))
        elif isinstance(event, TrialStep):
            record = event.record
            speed = record.tokens_per_s
            if isinstance(record, PredictStep):
                run.steps_target = record.total
                speed = record.series / record.step_time_s if record.step_time_s > 0 else float("nan")
            run.add_step(record.step, record.loss, record.step_time_s, speed)
        elif isinstance(event, TrialFinished):
            run.end_trial()
            self._trial_finished(event.result)
        elif isinstance(event, BenchmarkFinished):
            self.report = event.report
        self._show_run()

    def on_job_note(self, message: JobNote) -> None:
        self.run_state.note = message.text
        self._show_run()

    def on_training_step(self, message: TrainingStep) -> None:
        record = message.record
        run = self.run_state
        run.steps_target = message.target_steps
        run.add_step(record.step, record.loss, record.step_time_s, record.tokens_per_s)
        self._show_run()

    def on_job_finished(self, message: JobFinished) -> None:
        self.run_state.end(message.phase, message.outcome)
        level = {"done": "ok", "cancelled": "warning", "failed": "error"}[message.phase]
        self.log_line(f"{message.job} {message.phase}: {message.outcome}", level)
        if message.job.startswith("benchmark") and message.result is not None:
            self._benchmark_answer(message.result)
        self._show_run()

    # -- actions --------------------------------------------------------------------------
    def action_benchmark(self, task: str) -> None:
        preset = self._start_job(f"benchmark {task}")
        if preset is None:
            return
        self.results_task = task
        self.results = ResultsModel(columns(task))
        self._show_results()
        out = default_run_dir("benchmark", f"{preset.name}-{task}", root=self.out_dir)  # a new folder per run
        self.log_line(f"benchmark {task}: results in {out}")
        self.folders.append(out)
        self._run_job(jobs.benchmark, preset, task, self.benchmark_options, out, self._cancel)

    def action_autobatch(self) -> None:
        preset = self._start_job("autobatch")
        if preset is not None:
            self._run_job(jobs.autobatch, preset, self._cancel)

    def action_train(self) -> None:
        if self.recommended is None or not self.recommended.is_file():
            self.log_line("no recommended.toml yet: run the training benchmark (b) to the end first", "warning")
            return
        preset = self._start_job("training")
        if preset is None:
            return
        folder, resume = self._training_folder(preset, self.recommended)
        self.folders.append(folder)
        self.log_line(f"training with {self.recommended}" + (f", continuing the cancelled run in {folder}"
                                                              if resume else f" into {folder}"))
        self._run_job(jobs.train, self.recommended, folder, resume, self._cancel)

    def _training_folder(self, preset: Preset, config_path: Path) -> tuple[Path, bool]:
        """The newest cancelled run of this config (resumed), else a new folder under OUT/train/."""
        from kronos_core.train import TrainConfig
        from kronos_tune.train.run_folder import find_resumable

        try:
            config = TrainConfig.from_toml(config_path)
            found = find_resumable(self.out_dir, preset.name, config, 1)
        except KronosError:
            found = None  # the job reports the config's problem
        if found is not None:
            return found, True
        return default_run_dir("train", preset.name, root=self.out_dir), False

    def action_cancel(self) -> None:
        if not self.busy:
            self.log_line("nothing to cancel")
            return
        self._cancel.set()
        self.run_state.cancelling()
        self.log_line("cancelling: the current step finishes first, finished results stay", "warning")
        self._show_run()

    def action_export(self) -> None:
        if self.report is None:
            self.log_line("nothing to export: run the benchmark (b or B) first", "warning")
            return
        folder = default_run_dir("exports", f"{self.report.preset}-{self.report.task}", root=self.out_dir)
        self.folders.append(folder)
        self._export(self.report, folder)

    def farewell(self) -> str:
        """What the terminal keeps after the dashboard closes: where this session's runs are."""
        if not self.folders:
            return f"no run started; run folders go under {self.out_dir}/"
        return "run folders of this session: " + ", ".join(str(folder) for folder in dict.fromkeys(self.folders))

    @work(thread=True, group="export", exit_on_error=False)
    def _export(self, report: BenchmarkReport, folder: Path) -> None:
        try:
            from kronos_tune.benchmark import write_reports

            written = write_reports(report, folder)
        except Exception as error:
            self.post_message(LogLine(f"export failed: {one_line(error)}", "error"))
            return
        names = ", ".join(Path(p).name for p in written) if written else "reports"
        self.post_message(LogLine(f"exported {names} to {folder}", "ok"))

    def action_pause(self) -> None:
        self.paused = not self.paused
        if not self.paused:
            self._show_telemetry()
            self.query_one(RunPanel).show(self.run_state)
        self.log_line("panels paused (space resumes)" if self.paused else "panels resumed")
        self._show_status()

    @on(DataTable.HeaderSelected)
    def _sort_by_header(self, event: DataTable.HeaderSelected) -> None:
        self.results.sort_by(str(event.column_key.value))
        self._show_results()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(help_rows()))

    def action_pick_preset(self) -> None:
        if self.busy:
            self.log_line("finish or cancel the run (c) before changing the preset", "warning")
            return
        try:
            presets = list_presets(self.preset_dirs)
        except KronosError as error:
            self.log_line(str(error), "error")
            return
        current = self.preset.name if self.preset else None
        self.push_screen(PresetPicker(presets, current), self._preset_chosen)

    def _preset_chosen(self, name: str | None) -> None:
        if name is None:
            return
        previous = self.preset.name if self.preset else None
        try:
            self.preset = resolve_preset(name, self.preset_dirs)
        except KronosError as error:
            self.log_line(str(error), "error")
            return
        if self.preset.name != previous:  # results, answer and recommended.toml belong to the other preset
            self._clear_results(previous)
        self.log_line(f"preset {self.preset.name}: {self.preset.description}")
        self._show_status()
        self._show_telemetry()

    async def action_quit(self) -> None:
        """Cancel any run, wait for its worker to finish the current step, stop the sampler, exit."""
        if self._quitting:
            return
        self._quitting = True
        if self.busy:
            self._cancel.set()
            self.run_state.cancelling()
            self._show_run()
            self.log_line("quitting: waiting for the current step to finish", "warning")
            while self.busy:
                await asyncio.sleep(0.05)
        self.stop_telemetry()
        self.exit(0)

    def stop_telemetry(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self.sampler is not None:
            self.sampler.close()

    def on_unmount(self) -> None:
        self.stop_telemetry()
        self._cancel.set()

