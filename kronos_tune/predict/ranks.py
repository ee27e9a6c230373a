"""One rank of a sharded `kronos-tune predict` job: claim a chunk, predict it, write its part, repeat.

    python -m torch.distributed.run --nproc-per-node 2 --standalone -m kronos_tune.predict.ranks WORK/job.json

Rank 0 hosts a TCPStore (torch.distributed's public key-value store) on its own host, the rendezvous
host, and tells the others its port; every rank then takes the next chunk with `store.add(CLAIMED, 1)`,
an atomic counter, so a rank that is twice as fast takes about twice the chunks. The list of chunks to
do is what rank 0 finds unfinished in the work folder when the group starts, so a group restarted by
torchrun (--max-restarts) or a --resume continues where the records end.

Benchmark knob: KRONOS_BENCH_SLOW_RANK=RANK:FACTOR makes that rank FACTOR times slower (it sleeps
FACTOR - 1 times each chunk's prediction time), to measure how the claiming shares work; never set it
in a real run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch

from kronos_core.errors import KronosError
from kronos_core.launch import emit_event
from kronos_core.predict.sharded import ShardJob, build_predictor, rank_main, reported
from kronos_tune.predict.chunk_run import ChunkSettings, predict_chunk
from kronos_tune.predict.parts import write_part
from kronos_tune.predict.series import load_saved_series
from kronos_tune.predict.workdir import WorkFolder

CLAIMED = "kronos/chunks-claimed"
SLOW_RANK_KNOB = "KRONOS_BENCH_SLOW_RANK"


def slow_factor(rank: int) -> float:
    """The benchmark's planted slowdown for this rank (1.0: none)."""
    value = os.environ.get(SLOW_RANK_KNOB, "")
    if not value:
        return 1.0
    which, _, factor = value.partition(":")
    return float(factor or 1.0) if int(which) == rank else 1.0


def check_shared(work: WorkFolder, ctx, run_id: str) -> None:
    """Every rank sees every other rank's marker in the work folder (one folder on shared storage)."""
    markers = work.path / "markers"
    markers.mkdir(parents=True, exist_ok=True)
    (markers / f"rank-{ctx.rank}-{run_id}").write_text(str(os.getpid()))
    ctx.barrier()
    missing = [r for r in range(ctx.world_size) if not (markers / f"rank-{r}-{run_id}").exists()]
    seen = ctx.all_gather_object(missing)
    for rank, lost in enumerate(seen):
        if lost:
            raise KronosError(f"the work folder {work.path} is not shared: rank {rank} does not see rank "
                              f"{lost[0]}'s marker there; on several nodes put --out on storage every node mounts "
                              f"at the same path (NFS, Lustre...)")


def claim_store(ctx):
    """A TCPStore on rank 0's host; the others learn its port through the process group."""
    from torch.distributed import TCPStore

    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    store = None
    if ctx.rank == 0:
        store = TCPStore(host, 0, ctx.world_size, is_master=True, timeout=timedelta(minutes=30),
                         wait_for_workers=False)
    port = ctx.broadcast_object(store.port if store is not None else None)
    if store is None:
        store = TCPStore(host, port, ctx.world_size, is_master=False, timeout=timedelta(minutes=30))
    return store


def run_rank(job_file: Path) -> int:
    from kronos_core.train.distributed import DistContext

    job = ShardJob(**json.loads(job_file.read_text()))
    if job.threads:
        torch.set_num_threads(job.threads)
    job_work = WorkFolder(Path(job.extra["work"]), {})
    settings = ChunkSettings.from_dict(job.extra["settings"])
    ctx = DistContext.from_env(job.device)
    rank = ctx.rank

    def work() -> None:
        run_id = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)}"
        check_shared(job_work, ctx, run_id)
        if job.fault_rank == rank:
            raise KronosError(f"rank {rank} failed on purpose (fault_rank)")
        store = claim_store(ctx)
        finished = job_work.finished() if rank == 0 else None
        todo = ctx.broadcast_object([k for k in range(job.extra["chunks"]) if k not in (finished or {})])
        predictor = build_predictor(job, ctx.device(job.device))
        emit_event("ready", rank=rank, world=ctx.world_size, chunks=len(todo), pid=os.getpid())
        slowdown = slow_factor(rank)
        while True:
            claimed = store.add(CLAIMED, 1) - 1
            if claimed >= len(todo):
                break
            chunk = todo[claimed]
            series = load_saved_series(job_work.inputs(chunk))
            started = time.perf_counter()
            table, negative = predict_chunk(predictor, series, settings)
            seconds = time.perf_counter() - started
            if slowdown > 1:
                time.sleep((slowdown - 1) * seconds)
                seconds *= slowdown
            write_part(job_work, chunk, table, series, rank, seconds)
            emit_event("chunk", rank=rank, chunk=chunk, series=len(series), seconds=seconds, negative=negative)
        ctx.barrier()  # every claimed chunk is written; rank 0's store may go
        if rank == 0:
            emit_event("finished", chunks=job.extra["chunks"])
        ctx.close()

    return reported(rank, work)


def main(argv: list[str] | None = None) -> int:
    return rank_main("kronos_tune.predict.ranks", run_rank, argv)


if __name__ == "__main__":
    sys.exit(main())
