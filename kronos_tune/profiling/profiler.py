"""torch.profiler around the real training step: top ops, memory by category, traces, MFU."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from kronos_tune.torch_private import memory_timeline
from kronos_core.train import TrainConfig, Trainer
from kronos_tune.errors import KronosTuneError
from kronos_tune.profiling.flops import mfu, train_flops_per_token


@dataclass
class OpRow:
    name: str
    calls: int
    self_time_s: float
    total_time_s: float
    self_memory_bytes: int


@dataclass
class ProfileResult:
    device: str
    steps: int
    step_time_s: dict[str, float]
    time_basis: str  # "device" (CUDA kernel time) or "cpu"
    top_ops: list[OpRow]
    memory_at_peak_bytes: dict[str, int]
    memory_peak_bytes: int | None
    tokens_per_step: int
    tokens_per_s: float
    flops_per_token: float
    mfu: float | None
    trace_path: str | None = None
    tensorboard_dir: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["top_ops"] = [op.__dict__ for op in self.top_ops]
        return out


NATIVE_NOISE = ("USDT:",)  # libkineto's trace markers (profiler_start / profiler_stop), written to fd 2


@contextlib.contextmanager
def native_stderr_without(prefixes: tuple[str, ...]) -> Iterator[None]:
    """Route file descriptor 2 (where C++ libraries write) to a temporary file for the block, then pass on every
    line except those starting with `prefixes`. Python's own stderr writes in the block are kept too."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all: nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith(prefixes)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def check_output_paths(trace_path: Path | None, tensorboard_dir: Path | None) -> None:
    """Fail before any work when an output cannot be written."""
    if trace_path is not None:
        folder = trace_path.expanduser().resolve().parent
        if not folder.is_dir():
            raise KronosTuneError(f"--trace {trace_path}: folder {folder} does not exist; create it or pick another path")
        if not os.access(folder, os.W_OK):
            raise KronosTuneError(f"--trace {trace_path}: folder {folder} is not writable; pick another path")
    if tensorboard_dir is not None:
        parent = tensorboard_dir.expanduser().resolve().parent
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise KronosTuneError(f"--tensorboard {tensorboard_dir}: cannot create it in {parent} "
                                  f"(missing or not writable); pick another folder")


def _memory_by_category(prof: profile, device: str) -> tuple[dict[str, int], int | None, str | None]:
    """Bytes per category (parameter, gradient, activation, ...) at the moment of peak total memory."""
    try:  # private torch API (kronos_tune.torch_private): keep the rest of the report if it changes
        sizes, names = memory_timeline(prof, device)
    except Exception as error:  # noqa: BLE001 - any failure here only loses this table
        return {}, None, f"memory timeline unavailable in torch {torch.__version__}: {type(error).__name__}"
    if not sizes:
        return {}, None, "memory timeline recorded no allocations"
    totals = [sum(row) for row in sizes]
    peak_row = sizes[totals.index(max(totals))]
    by_category = {names[i]: value for i, value in enumerate(peak_row) if value > 0}
    return by_category, max(totals), None


def _top_ops(prof: profile, on_cuda: bool, top: int) -> list[OpRow]:
    events = prof.key_averages()
    self_time = (lambda e: e.self_device_time_total) if on_cuda else (lambda e: e.self_cpu_time_total)
    total_time = (lambda e: e.device_time_total) if on_cuda else (lambda e: e.cpu_time_total)
    # Python-level events recorded by with_stack (locks, builtins) and step markers are not ops.
    ops = [e for e in events if not e.key.startswith(("<built-in", "ProfilerStep", "Optimizer.step"))
           and "/" not in e.key and ".py(" not in e.key]
    rows = sorted(ops, key=self_time, reverse=True)[:top]
    return [OpRow(e.key, e.count, self_time(e) / 1e6, total_time(e) / 1e6, int(e.self_cpu_memory_usage))
            for e in rows]


def profile_training(config: TrainConfig, *, steps: int = 3, warmup: int = 1, wait: int = 1, top: int = 15,
                     trace_path: Path | None = None, tensorboard_dir: Path | None = None,
                     peak_flops: float | None = None) -> ProfileResult:
    """Run wait + warmup + steps real training steps under torch.profiler and summarize the active ones."""
    if steps < 1 or warmup < 0 or wait < 0:
        raise KronosTuneError(f"profile: steps must be >= 1 and warmup/wait >= 0 (got {steps}, {warmup}, {wait})")
    check_output_paths(trace_path, tensorboard_dir)
    notes: list[str] = ["step times include the profiler's own overhead (with_stack and memory recording)"]
    with tempfile.TemporaryDirectory(prefix="kronos-profile-") as scratch:
        trainer = Trainer(config.replace(output_dir=scratch))
        try:
            on_cuda = trainer.device.type == "cuda"
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
            tb_handler = tensorboard_trace_handler(str(tensorboard_dir)) if tensorboard_dir else None

            def on_ready(prof: profile) -> None:
                if tb_handler is not None:
                    tb_handler(prof)
                if trace_path is not None:
                    prof.export_chrome_trace(str(trace_path))

            records = []
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Profiler won't be using warmup")  # noted below
                prof = profile(activities=activities,
                               schedule=schedule(wait=wait, warmup=warmup, active=steps, repeat=1),
                               on_trace_ready=on_ready, profile_memory=True, record_shapes=True, with_stack=True)
            if warmup == 0:
                notes.append("no profiler warm-up step (--warmup 0): the first profiled step carries one-off costs")
            with native_stderr_without(NATIVE_NOISE):  # the profiler's start/stop: kineto's log lines
                prof.start()
            try:
                for index in range(wait + warmup + steps):
                    record = trainer.train_step()
                    if index >= wait + warmup:
                        records.append(record)
                    with native_stderr_without(NATIVE_NOISE):
                        prof.step()
            finally:
                with native_stderr_without(NATIVE_NOISE):
                    prof.stop()
            top_ops = _top_ops(prof, on_cuda, top)
            by_category, peak, note = _memory_by_category(prof, str(trainer.device))
            if note:
                notes.append(note)
            model = trainer.model
        finally:
            trainer.close()
    times = [r.step_time_s for r in records]
    tokens_per_step = records[-1].tokens
    tokens_per_s = tokens_per_step / statistics.median(times)
    sequence = config.lookback_window + config.predict_window
    flops = train_flops_per_token(model, sequence) if config.what == "predictor" else 0.0
    if config.what != "predictor":
        notes.append("MFU is computed for the predictor only")
    return ProfileResult(
        device=str(trainer.device), steps=steps,
        step_time_s={"median": statistics.median(times), "min": min(times), "max": max(times), "n": len(times)},
        time_basis="device" if on_cuda else "cpu", top_ops=top_ops, memory_at_peak_bytes=by_category,
        memory_peak_bytes=peak, tokens_per_step=tokens_per_step, tokens_per_s=tokens_per_s,
        flops_per_token=flops, mfu=mfu(tokens_per_s, flops, peak_flops) if flops else None,
        trace_path=str(trace_path) if trace_path else None,
        tensorboard_dir=str(tensorboard_dir) if tensorboard_dir else None, notes=notes)

