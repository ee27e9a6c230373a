"""Prediction sharded over processes and machines: the per-rank entry and the files it shares with the parent.

    python -m torch.distributed.run --nproc-per-node 2 --standalone -m kronos_core.predict.sharded WORK/job.json

The parent (`kronos-tune predict --nproc N`, the protocol's sharding trial)
prepares every series once (`write_job`: WORK/inputs.npz with x [N, L, 6],
x_stamp, y_stamp, and WORK/job.json with the model and predictor settings),
then starts the ranks through `kronos_core.launch`. Rank r of W predicts the
r-th contiguous block of series with `predict_arrays`, writes its part
atomically (WORK/part-00r.npy, next to the parent's job on its own node),
and the parts are gathered to rank 0, which writes WORK/predictions.npy
(mean paths [N, P, 6]) atomically once every rank has delivered: a merged
file exists only when all ranks succeeded. Devices: cuda:LOCAL_RANK with
NCCL, or the CPU with gloo.

Greedy outputs equal one process's that runs the same blocks (CPU matmuls
round differently for other batch compositions, so compare with
max_batch_size set to the block size). Sampling is seeded with the job's
seed on every rank (never seed + rank); with per-series stream keys in the
inputs (`write_job(..., keys=)`) a series' sampled paths are its own whatever
the rank. `kronos-tune predict` runs large jobs with ranks that claim chunks
instead (kronos_tune.predict.ranks); this static split serves the predict
benchmark's timed sharding trial.
With `repeats` > 0 every rank runs the shard that many more times between
barriers and rank 0 reports each run's wall time (the protocol's timing).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kronos_core.errors import KronosError
from kronos_core.files import atomic_writer
from kronos_core.launch import emit_event, rank_main, reported
from kronos_core.predict.spec import PredictorSpec, build_predictor

JOB_FILE = "job.json"
INPUTS_FILE = "inputs.npz"
MERGED_FILE = "predictions.npy"


@dataclass
class ShardJob:
    """What every rank needs besides the arrays; written to WORK/job.json."""

    size: str | None = None
    checkpoint: str | None = None
    tokenizer: str | None = None
    seed: int = 0
    device: str = "cpu"           # "cpu" or "cuda" (each rank takes cuda:LOCAL_RANK)
    amp: str | None = None
    max_context: int = 512
    window_mode: str = "refill"
    max_batch_size: int | None = None
    cuda_graphs: bool | None = None
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.9
    sample_count: int = 1
    repeats: int = 0              # extra timed runs after the first (benchmarks)
    threads: int | None = None    # intra-op threads per rank (None: torchrun's OMP_NUM_THREADS or torch's)
    fault_rank: int | None = None  # test hook: this rank fails before predicting
    extra: dict[str, Any] = field(default_factory=dict)


def shard_bounds(count: int, world: int) -> list[tuple[int, int]]:
    """Contiguous [begin, end) blocks of `count` series for `world` ranks, sizes differing by at most one."""
    edges = np.linspace(0, count, world + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def _atomic_save(path: Path, array: np.ndarray) -> None:
    with atomic_writer(path, "wb") as stream:
        np.save(stream, array)


def write_job(workdir: Path, job: ShardJob, x: np.ndarray, x_stamp: np.ndarray, y_stamp: np.ndarray,
              keys: np.ndarray | None = None) -> Path:
    """Write the inputs and settings for the ranks; returns the job file to pass them. `keys`: each series'
    stream key (kronos_core.predict.streams), passed to the predictor with the job's seed."""
    workdir.mkdir(parents=True, exist_ok=True)
    extra = {} if keys is None else {"keys": np.asarray(keys, dtype=np.int64)}
    np.savez(workdir / INPUTS_FILE, x=x, x_stamp=x_stamp, y_stamp=y_stamp, **extra)
    path = workdir / JOB_FILE
    path.write_text(json.dumps(asdict(job), indent=2))
    return path


def read_merged(workdir: Path) -> np.ndarray | None:
    """Mean paths [N, P, 6] when every rank succeeded (rank 0 writes them last), else None."""
    path = workdir / MERGED_FILE
    return np.load(path) if path.is_file() else None


def job_predictor(job: ShardJob, device: torch.device):
    """The predictor a rank runs: the job's weights and settings on `device`."""
    spec = PredictorSpec(size=job.size, checkpoint=job.checkpoint, tokenizer=job.tokenizer, seed=job.seed,
                         amp=job.amp, max_context=job.max_context, window_mode=job.window_mode,
                         max_batch_size=job.max_batch_size, cuda_graphs=job.cuda_graphs)
    return build_predictor(spec.on(device))


def run_rank(workdir: Path) -> int:
    from kronos_core.train.distributed import DistContext

    job = ShardJob(**json.loads((workdir / JOB_FILE).read_text()))
    if job.threads:
        torch.set_num_threads(job.threads)
    ctx = DistContext.from_env(job.device)
    rank, world = ctx.rank, ctx.world_size

    def work() -> None:
        if job.fault_rank == rank:
            raise KronosError(f"rank {rank} failed on purpose (fault_rank)")
        with np.load(workdir / INPUTS_FILE) as inputs:
            x, x_stamp, y_stamp = inputs["x"], inputs["x_stamp"], inputs["y_stamp"]
            keys = inputs["keys"] if "keys" in inputs.files else None
        begin, end = shard_bounds(len(x), world)[rank]
        predictor = job_predictor(job, ctx.device(job.device))
        emit_event("ready", rank=rank, world=world, series=end - begin, pid=os.getpid())
        values = None
        for run in range(1 + job.repeats):
            torch.manual_seed(job.seed)  # the same on every rank: a rank is no part of a series' draws
            streams = {} if keys is None else {"keys": keys[begin:end], "seed": job.seed}
            ctx.barrier()
            started = time.perf_counter()
            values = predictor.predict_arrays(x[begin:end], x_stamp[begin:end], y_stamp[begin:end],
                                              T=job.temperature, top_k=job.top_k, top_p=job.top_p,
                                              sample_count=job.sample_count, mean_only=True, **streams)
            ctx.barrier()
            if rank == 0:
                emit_event("run", index=run, seconds=time.perf_counter() - started, series=len(x))
        _atomic_save(workdir / f"part-{rank:05d}.npy", values)
        peak = torch.cuda.max_memory_allocated(predictor.device) if predictor.device.type == "cuda" else None
        emit_event("part", rank=rank, begin=begin, end=end, peak_gpu_bytes=peak)
        parts = ctx.all_gather_object((begin, end, values))
        if rank == 0:
            merged = np.empty((len(x), *values.shape[1:]), dtype=values.dtype)
            for part_begin, part_end, part in parts:
                merged[part_begin:part_end] = part
            _atomic_save(workdir / MERGED_FILE, merged)
            emit_event("merged", series=len(x))
        ctx.close()

    return reported(rank, work)


def main(argv: list[str] | None = None) -> int:
    return rank_main("kronos_core.predict.sharded", lambda job_file: run_rank(job_file.parent), argv)


if __name__ == "__main__":
    sys.exit(main())
