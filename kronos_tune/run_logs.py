"""What a run leaves behind to watch and plot: metrics.jsonl and TensorBoard event files.

    with RunLog(run_folder / METRICS_FILE, run_folder / TENSORBOARD_DIR) as log:
        log.step(record.to_dict())      # a StepRecord's fields (in process, or rank 0's event)
        log.eval(eval_record.to_dict())

- ``metrics.jsonl``: one JSON object per line, ``kind`` "train" (step, epoch,
  loss, lr, grad_norm, tokens_per_s, samples_per_s, step_time_s, ...) or
  "eval" (step, epoch, val_loss and the other metrics), each with ``time``
  (Unix seconds). Appended and flushed line by line, so it can be read while
  the run goes on. A resumed run appends a ``"kind": "resume"`` line with the
  step it starts from, then its own steps: steps an interrupted run logged
  after its last checkpoint are run again, and ``read_metrics`` keeps only the
  later lines (the file itself keeps both).
- TensorBoard (optional extra ``[tensorboard]``): scalars ``train/loss``,
  ``train/lr``, ``train/tokens_per_s``, ``train/samples_per_s``,
  ``train/grad_norm``, ``train/step_time_s``, ``val/loss`` and ``val/<metric>``
  through ``torch.utils.tensorboard.SummaryWriter``, imported only here and
  only when asked for. Each writer adds an event file of its own (host, pid
  and time in its name), so a resumed run never overwrites the earlier one;
  it opens with ``purge_step`` at its first step, so TensorBoard hides the
  earlier run's events from that step on, as ``read_metrics`` does.

The benchmark writes the same per trial: ``curves/<trial>.jsonl`` and, with
``--tensorboard``, ``tensorboard/<trial>/`` (kronos_tune.benchmark.events.TrialCurves).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from kronos_core.optional import missing, require
from kronos_tune.errors import KronosTuneError

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
CURVES_DIR = "curves"
TENSORBOARD_MODULE = "torch.utils.tensorboard"  # torch's writer, over the tensorboard package
STEP_KEYS = ("step", "epoch", "loss", "lr", "grad_norm", "tokens_per_s", "samples_per_s", "step_time_s",
             "samples", "tokens", "peak_memory_bytes", "skipped")
TRAIN_SCALARS = ("loss", "lr", "tokens_per_s", "samples_per_s", "grad_norm", "step_time_s")


def tensorboard_available() -> bool:
    """Whether torch.utils.tensorboard imports (the tensorboard package is installed and usable)."""
    return missing("tensorboard", TENSORBOARD_MODULE) is None


def want_tensorboard(flag: bool | None) -> bool:
    """--tensorboard / --no-tensorboard / neither (on when the package imports); asked for without it: one line."""
    if flag is False:
        return False
    if flag:
        require("tensorboard", "--tensorboard", TENSORBOARD_MODULE, instead="leave out --tensorboard")
        return True
    return tensorboard_available()


def check_log_paths(metrics: Path, tensorboard: Path | None) -> None:
    """A one-line error, before anything is written, when the run's logs could not be written there."""
    if metrics.exists() and not metrics.is_file():
        raise KronosTuneError(f"{metrics}: that is a folder, not the run's metrics file; move it away so the run "
                              f"can write its metrics")
    if tensorboard is None:
        return
    if tensorboard.exists() and not tensorboard.is_dir():
        raise KronosTuneError(f"--tensorboard: {tensorboard} is a file, so TensorBoard cannot write its folder "
                              f"there; move the file away or add --no-tensorboard")
    if tensorboard.is_dir():
        try:
            with tempfile.NamedTemporaryFile(dir=tensorboard, prefix=".write-test-"):
                pass
        except OSError as error:
            raise KronosTuneError(f"--tensorboard: cannot write in {tensorboard} ({error.strerror or error}); "
                                  f"make it writable or add --no-tensorboard") from None


def _number(value: Any) -> Any:
    """JSON has no NaN/inf: those become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunLog:
    """metrics.jsonl (always) and TensorBoard scalars (when `tensorboard` names a folder) for one run or trial."""

    def __init__(self, metrics: Path, tensorboard: Path | None = None, mode: str = "a", resumed_at: int = 0) -> None:
        """``resumed_at``: the optimizer step a resumed run starts after (0: a new run)."""
        check_log_paths(metrics, tensorboard)
        self.metrics_path = metrics
        self.writer: Any = None
        try:
            metrics.parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[str] | None = open(metrics, mode, encoding="utf-8")  # noqa: SIM115 - closed in close()
        except OSError as error:
            raise KronosTuneError(f"{metrics}: cannot write the run's metrics ({error.strerror or error}); pick a "
                                  f"folder you can write to") from None
        if tensorboard is not None:
            from torch.utils.tensorboard import SummaryWriter

            try:
                self.writer = SummaryWriter(log_dir=str(tensorboard), flush_secs=5,
                                            purge_step=resumed_at + 1 if resumed_at > 0 else None)
            except OSError as error:
                self.close()
                raise KronosTuneError(f"--tensorboard: cannot write in {tensorboard} ({error.strerror or error}); "
                                      f"make it writable or add --no-tensorboard") from None
        if resumed_at > 0:
            self._write({"kind": "resume", "step": resumed_at})

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, line: dict[str, Any]) -> None:
        if self._file is None:
            return
        line["time"] = round(time.time(), 3)
        self._file.write(json.dumps({k: _number(v) for k, v in line.items()}) + "\n")
        self._file.flush()

    def step(self, values: dict[str, Any]) -> None:
        """One optimizer step (a StepRecord's `to_dict()`, or a predict trial's step)."""
        self._write({"kind": "train", **{k: values[k] for k in STEP_KEYS if k in values}})
        if self.writer is not None:
            step = int(values["step"])
            for key in TRAIN_SCALARS:
                value = values.get(key)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.writer.add_scalar(f"train/{key}", value, step)

    def eval(self, values: dict[str, Any]) -> None:
        """One evaluation (an EvalRecord's `to_dict()`): step, epoch, val_loss and the other metrics."""
        self._write({"kind": "eval", **{k: v for k, v in values.items() if k != "event"}})
        if self.writer is not None:
            step = int(values["step"])
            for key, value in values.items():
                counted = key.endswith(("_tokens", "_elements"))  # how much was evaluated, not a metric
                if key in ("step", "epoch", "best", "scheduled", "event") or counted or \
                        not isinstance(value, (int, float)):
                    continue
                tag = "val/loss" if key == "val_loss" else f"val/{key}"
                self.writer.add_scalar(tag, value, step)
            self.writer.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def stage_log(folder: Path, tensorboard: bool, resumed_at: int = 0) -> RunLog:
    """The RunLog of one training stage's folder: folder/metrics.jsonl and folder/tensorboard/; ``resumed_at``:
    the step a resumed run continues from (its trainer's step before the first new one)."""
    return RunLog(folder / METRICS_FILE, folder / TENSORBOARD_DIR if tensorboard else None, resumed_at=resumed_at)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The lines of a metrics.jsonl as the run kept them: at each ``resume`` line, the lines of steps after the
    step it resumed from are dropped (they were run again), and the resume lines themselves are left out.
    A last line cut short by a crash is skipped."""
    kept: list[dict[str, Any]] = []
    for text in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue
        if line.get("kind") == "resume":
            kept = [old for old in kept if old.get("step", 0) <= line["step"]]
        else:
            kept.append(line)
    return kept


__all__ = ["CURVES_DIR", "METRICS_FILE", "TENSORBOARD_DIR", "RunLog",
           "check_log_paths", "read_metrics", "stage_log", "tensorboard_available", "want_tensorboard"]
