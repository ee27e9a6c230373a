"""One training trial in its own process (what the runner launches), alone or one per rank under torchrun.

    python -m kronos_tune.protocol.trial_worker --job JOB.json
    python -m torch.distributed.run --standalone --nproc-per-node N -m kronos_tune.protocol.trial_worker --job JOB.json

Every trial runs in a process of its own so that the runner can stop it: a
trial past its watchdog, or a benchmark that receives SIGTERM/SIGINT, kills
the trial's whole process group (loader workers and compile workers
included), which no thread can do to a hung CUDA call or a deadlocked
DataLoader. It also gives each trial a fresh allocator, cuBLAS state and
compile cache, so one trial's warm-up never flatters the next.

JOB.json: ``config`` (TrainConfig keys), ``plan`` (measure.StepPlan),
``budget_bytes`` (per device), ``stop_file`` (its appearance stops every rank
after the current step), ``result_file`` and ``stack_file``. SIGUSR1 makes
every thread of this process (and of the loader workers it forked, which
inherit the handler) write its stack to ``stack_file``: the runner sends it
before killing a trial past its watchdog. Rank 0 prints one
``KRONOS_BENCH_STEP {json}`` line per optimizer step and writes its
TrainMeasurement to ``result_file``. A rank that runs out of memory writes
``result_file.rank<r>`` and exits 1 (torchrun then stops the others).
``KRONOS_TUNE_FAULT=hang:<trial>`` (a test hook) makes the named trial block
in its first step, as a deadlocked kernel or loader would.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

from kronos_core.train import StepRecord, TrainConfig
from kronos_tune.protocol.measure import StepPlan, TrainMeasurement, measure_training

STEP_PREFIX = "KRONOS_BENCH_STEP "
FAULT_ENV = "KRONOS_TUNE_FAULT"


def make_rank_meter(device: str, budget_bytes: int | None) -> Any:
    from kronos_tune.memory import CpuExactMeter, CudaMeter, apply_cuda_budget

    if device != "cuda":
        return CpuExactMeter(budget_bytes=budget_bytes)
    local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(local)
    notes = []
    if budget_bytes is not None and budget_bytes < torch.cuda.get_device_properties(local).total_memory:
        notes.append(apply_cuda_budget(budget_bytes, local))
    return CudaMeter(local, notes=notes)


def write_json(path: Path, data: dict[str, Any]) -> None:
    temp = path.with_name(path.name + f".tmp{os.getpid()}")
    temp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(temp, path)


def _injected_hang(trial: str) -> bool:
    kind, _, name = os.environ.get(FAULT_ENV, "").partition(":")
    return kind == "hang" and name == trial


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kronos_tune.protocol.trial_worker")
    parser.add_argument("--job", required=True)
    args = parser.parse_args(argv)
    job = json.loads(Path(args.job).read_text(encoding="utf-8"))
    rank = int(os.environ.get("RANK", "0"))
    stacks = open(job["stack_file"], "a", encoding="utf-8")  # noqa: SIM115 - open for the process's lifetime
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    config = TrainConfig.from_dict(job["config"], source=f"{job.get('trial', 'benchmark')} trial")
    stop_file = Path(job["stop_file"])
    result_file = Path(job["result_file"])
    meter = make_rank_meter(config.resolved_device(), job.get("budget_bytes"))
    hang = _injected_hang(job.get("trial", ""))
    if hang:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a process stuck in a CUDA or NCCL call does

    def emit(record: StepRecord) -> None:
        if hang:
            while True:  # blocks like a deadlock: only a kill ends it
                time.sleep(3600)
        if rank == 0:
            print(STEP_PREFIX + json.dumps(record.to_dict()), flush=True)

    result: TrainMeasurement = measure_training(
        config, meter, StepPlan.from_dict(job["plan"]), on_record=emit, should_stop=stop_file.exists,
        meter_always=config.resolved_device() == "cuda", agree_across_ranks=int(os.environ.get("WORLD_SIZE", 1)) > 1)
    if result.status == "oom":
        write_json(result_file.with_name(f"{result_file.name}.rank{rank}"), result.to_dict())
        return 1
    if rank == 0:
        write_json(result_file, result.to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main())
