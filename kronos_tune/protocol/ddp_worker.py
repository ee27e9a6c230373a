"""The DDP trial's process, one per rank under torchrun (what the runner launches).

    python -m torch.distributed.run --standalone --nproc-per-node N -m kronos_tune.protocol.ddp_worker --job JOB.json

JOB.json: ``config`` (TrainConfig keys), ``warmup``, ``steps``, ``pad``,
``budget_bytes`` (per device), ``stop_file`` (its appearance stops every rank
after the current step) and ``result_file``. Every rank meters its own device
with the budget (CPU: the exact tracker as a simulated device; CUDA: the
allocator meter, the card capped to the budget when bigger). Rank 0 prints
one ``KRONOS_BENCH_STEP {json}`` line per optimizer step and writes its
TrainMeasurement to ``result_file`` (its peak stands for every rank: they run
the same shapes). A rank
that runs out of memory writes ``result_file.rank<r>`` and exits 1 (torchrun
then stops the others).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from kronos_core.train import StepRecord, TrainConfig
from kronos_tune.protocol.measure import TrainMeasurement, measure_training

STEP_PREFIX = "KRONOS_BENCH_STEP "


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kronos_tune.protocol.ddp_worker")
    parser.add_argument("--job", required=True)
    args = parser.parse_args(argv)
    job = json.loads(Path(args.job).read_text(encoding="utf-8"))
    rank = int(os.environ.get("RANK", "0"))
    config = TrainConfig.from_dict(job["config"], source="ddp trial")
    stop_file = Path(job["stop_file"])
    result_file = Path(job["result_file"])
    meter = make_rank_meter(config.resolved_device(), job.get("budget_bytes"))

    def emit(record: StepRecord) -> None:
        if rank == 0:
            print(STEP_PREFIX + json.dumps(record.to_dict()), flush=True)

    result: TrainMeasurement = measure_training(
        config, meter, int(job["warmup"]), int(job["steps"]), int(job.get("pad", 0)), on_record=emit,
        should_stop=stop_file.exists, meter_always=config.resolved_device() == "cuda", agree_across_ranks=True)
    if result.status == "oom":
        write_json(result_file.with_name(f"{result_file.name}.rank{rank}"), result.to_dict())
        return 1
    if rank == 0:
        write_json(result_file, result.to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main())
