"""One trial in its own process (what the runner launches): a training trial alone or one per rank under
torchrun, or a predict trial (``"kind": "predict"``).

    python -m kronos_tune.benchmark.run.trial_worker --job JOB.json
    python -m torch.distributed.run --standalone --nproc-per-node N \
        -m kronos_tune.benchmark.run.trial_worker --job JOB.json

Every trial runs in a process of its own, started by the shared launcher
(kronos_core.launch), so that the runner can stop it: a trial past its
watchdog, or a benchmark that receives SIGTERM/SIGINT, kills the trial's whole
process group (loader workers and compile workers included), which no thread
can do to a hung CUDA call or a deadlocked DataLoader. It also gives each
trial a fresh allocator, cuBLAS state and compile cache, so one trial's
warm-up never flatters the next.

A ``"kind": "time-to-target"`` job trains one seed of a candidate until the
target validation loss (train/target.py) and writes how long it took.

JOB.json: ``config`` (TrainConfig keys), ``steps`` (train/measure.py: TrialSteps),
``budget_bytes`` (per device), ``result_file`` and ``stack_file``. SIGTERM
(the launcher's stop) makes every rank stop after the current step. SIGUSR1
makes every thread of this process (and of the loader workers it forked,
which inherit the handler) write its stack to ``stack_file``: the runner
sends it before killing a trial past its watchdog. Rank 0 emits one ``step``
event (kronos_core.launch.emit_event, a StepRecord's fields) per optimizer
step and writes its TrainMeasurement to ``result_file``; a predict trial
emits ``predict_step`` events. A rank that runs out of memory writes
``result_file.rank<r>`` and exits 1 (torchrun then stops the others).
Nothing here plants a fault or an effect: benchmarks/planted_trials.py does it
from outside, wrapping the session this worker builds (a sitecustomize shim).

Serving (the paired design): with ``commands`` in the job (a FIFO), the worker
warms up, runs the metered step, emits ``ready`` and then waits for one JSON
command per line, blocked in a read (no CPU, no GPU) between them:
``{"cmd": "measure"}`` (the sequential measurement, for the baseline's own row:
emits ``measured``), ``{"cmd": "block", "id": N, "steps": K}`` (K timed steps:
emits ``block`` with their times), ``{"cmd": "finish"}`` (on to the evaluation
step, writes ``result_file``, exits) and ``{"cmd": "exit"}``. A SIGTERM while it
waits ends it at once; during a block, after the step in flight.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from kronos_core.files import atomic_writer, write_text_atomic
from kronos_core.launch import emit_event
from kronos_core.train import StepRecord, TrainConfig
from kronos_tune.benchmark.train.measure import TrialSteps, TrialSession

STEP_EVENT = "step"
PREDICT_EVENT = "predict_step"
READY_EVENT, MEASURED_EVENT, BLOCK_EVENT, FINISHED_EVENT = "ready", "measured", "block", "finished"


class _Dismissed(Exception):
    """A stop signal while the worker waits for its next command."""


class StopFlag:
    """Set by SIGTERM/SIGINT (the launcher's stop): the trial stops after the step in flight; a worker waiting
    for a command (``idle``) stops at once."""

    def __init__(self) -> None:
        self.set = False
        self.idle = False
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.set = True
        if self.idle:
            raise _Dismissed

    def __call__(self) -> bool:
        return self.set


def make_rank_meter(device: str, budget_bytes: int | None) -> Any:
    """This rank's meter: on CUDA its own card (LOCAL_RANK), made current first."""
    from kronos_tune.memory import make_meter

    if device != "cuda":
        return make_meter(device, budget_bytes)
    local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(local)
    return make_meter(local, budget_bytes)


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data))


def run_predict(job: dict[str, Any], should_stop: StopFlag) -> int:
    """A predict trial: the metered run and the timed runs of measure_prediction; greedy outputs to one .npz
    file, the sampled run's (per-series streams) to another when the job names it."""
    import numpy as np

    from kronos_tune.benchmark.predict.measure import measure_prediction
    from kronos_tune.benchmark.results import PredictSettings

    settings = PredictSettings(**job["settings"])
    device, budget = job["device"], job.get("budget_bytes")
    if device == "cuda" and budget is not None:
        from kronos_tune.memory import apply_cuda_budget

        if budget < torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory:
            apply_cuda_budget(budget)

    def emit(step: Any) -> None:
        emit_event(PREDICT_EVENT, **asdict(step))

    reference = PredictSettings(**job["reference_settings"]) if job.get("reference_settings") else None
    m = measure_prediction(settings, device, budget, int(job["repeats"]), emit, should_stop, reference,
                           str(job.get("order_seed", "")), bool(job.get("seed_spread")))
    for frames, name in ((m.outputs, job["outputs_file"]), (m.sampled_outputs, job.get("sampled_file")),
                         (m.other_seed_outputs, job.get("other_seed_file"))):
        if frames and name:
            with atomic_writer(Path(name), "wb") as handle:
                np.savez(handle, *[frame.to_numpy() for frame in frames])
    if m.greedy_tokens is not None and job.get("tokens_file"):
        with atomic_writer(Path(job["tokens_file"]), "wb") as handle:
            np.save(handle, m.greedy_tokens)
    write_json(Path(job["result_file"]), {"status": m.status, "reason": m.reason, "seconds": m.seconds,
                                          "peak_memory_bytes": m.peak_memory_bytes,
                                          "metered_time_s": m.metered_time_s,
                                          "reference_seconds": m.reference_seconds, "order": m.order})
    return 0


def run_time_to_target(job: dict[str, Any], should_stop: StopFlag, rank: int) -> int:
    """One seed of the time-to-target comparison (train/target.py): train until the target loss, write the run."""
    from kronos_tune.benchmark.train.target import train_to_target

    config = TrainConfig.from_dict(job["config"], source=f"{job.get('trial', 'benchmark')} time to target")
    found = train_to_target(config, float(job["target"]), int(job["target_step"]), int(job["max_steps"]),
                            should_stop)
    if rank == 0 and not should_stop():
        write_json(Path(job["result_file"]), found.to_dict())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kronos_tune.benchmark.run.trial_worker")
    parser.add_argument("--job", required=True)
    args = parser.parse_args(argv)
    job = json.loads(Path(args.job).read_text(encoding="utf-8"))
    rank = int(os.environ.get("RANK", "0"))
    stacks = open(job["stack_file"], "a", encoding="utf-8")  # noqa: SIM115 - open for the process's lifetime
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    should_stop = StopFlag()
    if job.get("kind") == "predict":
        return run_predict(job, should_stop)
    if job.get("kind") == "time-to-target":
        return run_time_to_target(job, should_stop, rank)
    config = TrainConfig.from_dict(job["config"], source=f"{job.get('trial', 'benchmark')} trial")
    result_file = Path(job["result_file"])
    meter = make_rank_meter(config.resolved_device(), job.get("budget_bytes"))

    def emit(record: StepRecord) -> None:
        if rank == 0:
            emit_event(STEP_EVENT, **record.to_dict())

    session = TrialSession(config, meter, TrialSteps.from_dict(job["steps"]), on_record=emit, should_stop=should_stop,
                           meter_always=config.resolved_device() == "cuda",
                           agree_across_ranks=int(os.environ.get("WORLD_SIZE", 1)) > 1)
    try:
        if job.get("commands"):
            return serve(session, job, should_stop, result_file)
        result = session.run(session.open, session.warm_up, session.measure, session.finish)
    finally:
        session.close()
    if result.status == "oom":
        write_json(result_file.with_name(f"{result_file.name}.rank{rank}"), result.to_dict())
        return 1
    if rank == 0:
        write_json(result_file, result.to_dict())
    return 0


def serve(session: TrialSession, job: dict[str, Any], should_stop: StopFlag, result_file: Path) -> int:
    """The paired design's worker: warm up, then run the commands read from the FIFO (module docstring)."""
    result = session.run(session.open, session.warm_up)
    if result.status != "ok":  # out of memory or cancelled before the first command
        write_json(result_file, result.to_dict())
        return 0
    emit_event(READY_EVENT, measurement=result.to_dict())
    try:
        with open(job["commands"], encoding="utf-8") as commands:
            while True:
                should_stop.idle = True
                if should_stop.set:
                    raise _Dismissed
                line = commands.readline()
                should_stop.idle = False
                if not line:
                    return 0  # the runner is gone
                command = json.loads(line)
                kind = command.get("cmd")
                if kind == "exit":
                    return 0
                if kind == "measure":
                    session.run(session.measure, session.finish)
                    if result.status != "ok":
                        write_json(result_file, result.to_dict())
                    emit_event(MEASURED_EVENT, measurement=result.to_dict())
                elif kind == "block":
                    records: list[StepRecord] = []
                    evaluated_before = result.val_loss_step
                    session.run(lambda: records.extend(session.block(int(command.get("steps", 1)))))
                    if result.status != "ok":  # written before the runner hears of it
                        write_json(result_file, result.to_dict())
                    emit_event(BLOCK_EVENT, id=command.get("id"), status=result.status,
                               times=[r.step_time_s for r in records], steps=[r.step for r in records],
                               evaluated=result.val_loss_step != evaluated_before)
                elif kind == "finish":
                    session.run(session.finish)
                    write_json(result_file, result.to_dict())
                    emit_event(FINISHED_EVENT, status=result.status)
                    return 0
                if result.status != "ok":  # out of memory or cancelled in a part: what it measured is kept
                    write_json(result_file, result.to_dict())
                    return 0
    except _Dismissed:
        should_stop.idle = False
        result.status, result.reason = "cancelled", f"cancelled after {len(result.losses)} steps"
        write_json(result_file, result.to_dict())
        return 0


if __name__ == "__main__":
    sys.exit(main())
