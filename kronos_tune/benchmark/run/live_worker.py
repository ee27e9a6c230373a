"""A trial worker kept alive between units of work: the runner's side of trial_worker's serve mode.

    worker = LiveWorker(run, spec, work, job)      # started; warms up and runs its metered step
    ready = worker.ready(on_step)                   # TrainMeasurement so far (warm-up, memory)
    times = worker.block(3, on_step)                # three timed steps
    measured = worker.finish(on_step)               # on to the evaluation step; the process exits
    worker.close()

The process is a trial_worker started by the shared launcher under the run's
watchdog (isolation.run_watched), in a thread of its own; its events come
back through a queue, so every event reaches the run's listeners from the
runner's thread. Commands go down a FIFO that this side holds open for
reading and writing (so opening it never blocks, and the worker's read ends
when this process is gone). Between units of work the worker waits in that
read, using no CPU or GPU, and no deadline runs; each unit (the warm-up, every
block, the finish) has the run's trial timeout as its deadline, past which the
watchdog dumps the worker's stacks and kills it. A worker whose process ends
before it answers raises WorkerGone with what the run needs to record it.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kronos_tune.benchmark.task import RunContext
from kronos_tune.benchmark.run.isolation import Outcome, stderr_tail, timeout_reason
from kronos_tune.benchmark.train.measure import TrainMeasurement
from kronos_tune.benchmark.results import TrialSpec
from kronos_tune.benchmark.run.trial_worker import (
    BLOCK_EVENT, FINISHED_EVENT, MEASURED_EVENT, READY_EVENT, STEP_EVENT,
)

StepHandler = Callable[[dict[str, Any]], None]
JOIN_S = 10.0


class WorkerGone(Exception):
    """The worker's process ended before it answered: killed by the watchdog (``timed_out``), stopped by a
    cancel (``cancelled``) or crashed (``reason`` holds its last error line)."""

    def __init__(self, who: str, what: str, outcome: Outcome, reason: str) -> None:
        super().__init__(reason)
        self.who, self.what, self.outcome, self.reason = who, what, outcome, reason

    @property
    def timed_out(self) -> bool:
        return self.outcome.timed_out

    @property
    def cancelled(self) -> bool:
        return self.outcome.cancelled and not self.outcome.timed_out


class LiveWorker:
    """One serving trial_worker process (see the module docstring). `who` names it in reasons."""

    def __init__(self, run: RunContext, spec: TrialSpec, work: Path, job: dict[str, Any],
                 who: str | None = None) -> None:
        self.run, self.spec, self.work, self.who = run, spec, work, who or f"the {spec.name} trial's worker"
        self.fifo = work / "commands"
        os.mkfifo(self.fifo)
        self._fd: int | None = os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK)
        self.result_file = Path(job["result_file"])
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.deadline: float | None = time.monotonic() + run.trial_timeout_s
        self.outcome: Outcome | None = None
        self.stack_file: Path | None = None
        self.unit = "its start-up and warm-up"
        self.ids = itertools.count(1)
        self.ended = False
        self.evaluated_in_block = False  # the last block ran the evaluation (between two of its steps)
        self._thread = threading.Thread(target=self._launch, args=({**job, "commands": str(self.fifo)},),
                                        name=f"worker-{spec.name}", daemon=True)
        self._thread.start()

    def _launch(self, job: dict[str, Any]) -> None:
        try:
            self.outcome, self.stack_file = self.run.launch(self.spec, self.work, job, self.events.put,
                                                            deadline=lambda: self.deadline)
        finally:
            self.events.put(None)

    @property
    def alive(self) -> bool:
        return not self.ended

    # Units of work ---------------------------------------------------------------------------------------
    def _send(self, command: dict[str, Any], unit: str) -> None:
        if self.ended or self._fd is None:
            raise self._gone(unit)
        self.unit = unit
        self.deadline = time.monotonic() + self.run.trial_timeout_s
        os.write(self._fd, (json.dumps(command) + "\n").encode())

    def _wait(self, kind: str, on_step: StepHandler | None) -> dict[str, Any]:
        while True:
            event = self.events.get()
            if event is None:
                self.ended = True
                raise self._gone(self.unit)
            if event.get("event") == STEP_EVENT:
                if on_step is not None:
                    on_step(event)
                continue
            if event.get("event") == kind:
                self.deadline = None  # waiting for the next command: no watchdog
                return event

    def _gone(self, unit: str) -> WorkerGone:
        self._thread.join(timeout=JOIN_S)
        outcome = self.outcome or Outcome(code=None)
        if outcome.timed_out:
            reason = (f"{self.who} gave no answer for {unit}: "
                      + timeout_reason(self.run.trial_timeout_s, self.stack_file or self.work))
        elif outcome.cancelled:
            reason = f"{self.who} was stopped during {unit} (cancel)"
        else:
            reason = f"{self.who} died during {unit}: exited with code {outcome.code}: {stderr_tail(self.work)}"
        return WorkerGone(self.who, unit, outcome, reason)

    def ready(self, on_step: StepHandler | None = None) -> TrainMeasurement:
        """The warm-up and the metered step; a worker that ran out of memory there has ended (status oom)."""
        try:
            return TrainMeasurement.from_dict(self._wait(READY_EVENT, on_step)["measurement"])
        except WorkerGone:
            ended = self.measurement()
            if ended is not None:
                return ended
            raise

    def measure(self, on_step: StepHandler | None = None) -> TrainMeasurement:
        """The sequential measurement and the evaluation (the baseline's own row); the worker keeps serving."""
        self._send({"cmd": "measure"}, "its measured steps")
        return TrainMeasurement.from_dict(self._wait(MEASURED_EVENT, on_step)["measurement"])

    def block(self, steps: int, on_step: StepHandler | None = None, round_: int | None = None,
              untimed_after: int | None = None) -> list[float]:
        """`steps` timed steps; their times (fewer when it was cancelled or ran out of memory in the block).
        ``evaluated_in_block`` says afterwards whether the evaluation ran among them."""
        command: dict[str, Any] = {"cmd": "block", "id": next(self.ids), "steps": steps}
        where = (f" (round {round_})" if round_ is not None else
                 f" (untimed, after round {untimed_after})" if untimed_after is not None else "")
        self._send(command, f"block {command['id']}{where}")
        event = self._wait(BLOCK_EVENT, on_step)
        if event.get("status") != "ok":
            self.ended = True
        self.evaluated_in_block = bool(event.get("evaluated"))
        return [float(t) for t in event.get("times") or []]

    def finish(self, on_step: StepHandler | None = None) -> TrainMeasurement:
        """On to the evaluation step; the worker writes its measurement and exits."""
        self._send({"cmd": "finish"}, "its last steps and the evaluation")
        try:
            self._wait(FINISHED_EVENT, on_step)
        except WorkerGone:
            if self.measurement() is None:
                raise
        self._thread.join(timeout=JOIN_S)
        self.ended = True
        measured = self.measurement()
        if measured is None:
            raise self._gone("its evaluation")
        return measured

    def measurement(self) -> TrainMeasurement | None:
        """What the worker wrote before it ended (None: nothing)."""
        if not self.result_file.is_file():
            return None
        return TrainMeasurement.from_dict(json.loads(self.result_file.read_text(encoding="utf-8")))

    def close(self) -> None:
        """Dismiss the worker (it exits from its wait) and release the FIFO; idempotent."""
        if self._fd is not None:
            if not self.ended:
                try:
                    os.write(self._fd, b'{"cmd": "exit"}\n')
                except OSError:
                    pass
            self._thread.join(timeout=JOIN_S)
            os.close(self._fd)
            self._fd = None
        self.ended = True
