"""One rank of a sharded `kronos-tune predict` job: claim a chunk, predict it, write its part, repeat.

    python -m torch.distributed.run --nproc-per-node 2 --standalone -m kronos_tune.predict.ranks WORK/job.json

Rank 0 hosts a TCPStore (torch.distributed's public key-value store) on its own host, the rendezvous
host, and tells the others its port; every rank then takes the next chunk with `store.add(CLAIMED, 1)`,
an atomic counter, so a rank that is twice as fast takes about twice the chunks. The list of chunks to
do is what rank 0 finds unfinished in the work folder when the group starts, so a group restarted by
torchrun (--max-restarts) or a --resume continues where the records end: a rank that dies loses only its
chunk in flight. A chunk's part, record and `chunk` event are written together, a SIGTERM (torchrun
stopping the group) held back until they are. Every attempt draws its store port, its marker names and its
process group (on a store of its own: `kronos_core.launch.torchrun_env`) afresh.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from kronos_core.errors import KronosError
from kronos_core.launch import emit_event
from kronos_core.launch import rank_main, reported
from kronos_core.predict.spec import PredictorSpec, build_predictor
from kronos_tune.predict.chunk_run import ChunkSettings, predict_chunk
from kronos_tune.predict.parts import write_part
from kronos_tune.predict.series import load_saved_series
from kronos_tune.predict.workdir import WorkFolder

CLAIMED = "kronos/chunks-claimed"


@contextmanager
def stop_after_commit():
    """A SIGTERM (torchrun stopping the group after a rank failed) that comes while a finished chunk's part,
    record and event are written ends the rank right after them, not between: the parent's count of chunk
    events then matches the records. Outside this block SIGTERM ends the rank at once, as by default."""
    held: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
    if held:
        os.kill(os.getpid(), signal.SIGTERM)


def check_shared(work: WorkFolder, ctx) -> None:
    """Every rank sees every other rank's marker in the work folder (one folder on shared storage). The
    markers are named by a token rank 0 draws for this group (torchrun's restart count can differ between
    nodes, and an earlier attempt's markers are still there)."""
    token = ctx.broadcast_object(uuid.uuid4().hex if ctx.rank == 0 else None)
    markers = work.path / "markers"
    markers.mkdir(parents=True, exist_ok=True)
    (markers / f"rank-{ctx.rank}-{token}").write_text(str(os.getpid()))
    ctx.barrier()
    missing = [r for r in range(ctx.world_size) if not (markers / f"rank-{r}-{token}").exists()]
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

    job = json.loads(job_file.read_text())
    spec = PredictorSpec.from_dict(job["predictor"])
    job_work = WorkFolder(Path(job["work"]), {})
    settings = ChunkSettings.from_dict(job["settings"])
    ctx = DistContext.from_env(job["device"])
    rank = ctx.rank

    def work() -> None:
        check_shared(job_work, ctx)
        store = claim_store(ctx)
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        finished = job_work.finished() if rank == 0 else None
        todo = ctx.broadcast_object([k for k in range(job["chunks"]) if k not in (finished or {})])
        predictor = build_predictor(spec.on(ctx.device(job["device"])))
        emit_event("ready", rank=rank, world=ctx.world_size, chunks=len(todo), pid=os.getpid(), attempt=attempt)
        while True:
            claimed = store.add(CLAIMED, 1) - 1
            if claimed >= len(todo):
                break
            chunk = todo[claimed]
            series = load_saved_series(job_work.inputs(chunk))
            started = time.perf_counter()
            table, negative = predict_chunk(predictor, series, settings)
            seconds = time.perf_counter() - started
            with stop_after_commit():
                write_part(job_work, chunk, table, series, rank, seconds)
                emit_event("chunk", rank=rank, chunk=chunk, series=len(series), seconds=seconds,
                           negative=negative, attempt=attempt)
        ctx.barrier()  # every claimed chunk is written; rank 0's store may go
        if rank == 0:
            emit_event("finished", chunks=job["chunks"])
        ctx.close()

    return reported(rank, work)


def main(argv: list[str] | None = None) -> int:
    return rank_main("kronos_tune.predict.ranks", run_rank, argv)


if __name__ == "__main__":
    sys.exit(main())
