"""`kronos-tune predict --nproc N [--nnodes ...]`: the series sharded over torchrun processes.

The parent prepares every series once, writes them for the ranks
(`kronos_core.predict.sharded.write_job`) in a fresh work folder, starts
torchrun through `kronos_core.launch` and reads back the merged predictions
that rank 0 writes only when every rank succeeded. A rank that fails stops
the others (torchrun, --max-restarts 0); the error names the rank and its
message, nothing is written to --out, and the work folder with the parts the
finished ranks wrote is kept and named. On success the folder is removed.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from kronos_core.launch import LaunchSpec, run_launch, torchrun_command
from kronos_core.predict.sharded import ShardJob, read_merged, write_job
from kronos_tune.errors import KronosTuneError


def world_size(spec: LaunchSpec) -> int | None:
    """Processes over all nodes (None when the node count is a MIN:MAX range)."""
    try:
        return spec.nproc * int(spec.nnodes or "1")
    except ValueError:
        return None


def check_shards(spec: LaunchSpec, series: int, device: str) -> None:
    world = world_size(spec)
    if world is not None and world > series:
        raise KronosTuneError(f"--nproc {spec.nproc}" + (f" on {spec.nnodes} nodes" if spec.multi_node else "")
                              + f" starts {world} processes for {series} series; use at most {series} processes")
    if device == "cuda" and spec.nproc > torch.cuda.device_count():
        raise KronosTuneError(f"--nproc {spec.nproc} on CUDA but {torch.cuda.device_count()} devices are visible; "
                              f"start at most one process per GPU")


def run_sharded(spec: LaunchSpec, job: ShardJob, x: np.ndarray, x_stamp: np.ndarray, y_stamp: np.ndarray,
                on_note: Callable[[str, str], None], stop_file: Path | None = None) -> np.ndarray | None:
    """Mean paths [N, P, 6] from the ranks; None on a node other than the one whose rank 0 merges."""
    check_shards(spec, len(x), job.device)
    work = Path(tempfile.mkdtemp(prefix="kronos-predict-shards-"))
    job_file = write_job(work, job, x, x_stamp, y_stamp)
    command = torchrun_command(spec, "kronos_core.predict.sharded", [str(job_file)])
    backend = "NCCL" if job.device == "cuda" else "gloo"
    ready: list[int] = []

    def on_event(event: dict) -> None:
        # On several nodes, say when this node's ranks have joined the others (the rendezvous is done).
        if event.get("event") == "ready" and spec.multi_node:
            ready.append(int(event.get("rank", -1)))
            if len(ready) == spec.nproc:
                ranks = ", ".join(map(str, sorted(ready)))
                on_note("note", f"rendezvous done: rank{'s' if len(ready) > 1 else ''} {ranks} of "
                                f"{event.get('world')} ready on this node")

    result = run_launch(command, on_event=on_event, stop_file=stop_file)
    if result.stopped:
        raise KronosTuneError(f"predict: stopped before every rank finished; nothing was written "
                              f"(the ranks' parts are kept in {work})")
    if not result.ok:
        errors = result.error_events()
        if errors:
            first = errors[0]
            reason = f"rank {first.get('rank')} failed: {first.get('message')}"
        elif spec.multi_node and any("RendezvousConnectionError" in line for line in result.tail):
            # the node whose agent hosts the rendezvous store (whichever bound the endpoint first) went away
            reason = (f"torchrun exited with code {result.returncode}: the connection to the rendezvous store was "
                      f"lost (the node hosting it at the rendezvous endpoint stopped or is unreachable)")
        else:
            last = next((line.strip() for line in reversed(result.tail) if line.strip()), "no message")
            reason = f"torchrun exited with code {result.returncode} ({last[:200]})"
        where = f"--nproc {spec.nproc}" + (f" --nnodes {spec.nnodes}" if spec.multi_node else "")
        raise KronosTuneError(f"predict {where}: {reason}; the other ranks were stopped and "
                              f"nothing was written (parts kept in {work})")
    merged = read_merged(work)
    if merged is None:
        on_note("note", "this node's ranks finished; the node running rank 0 writes the merged predictions")
        shutil.rmtree(work, ignore_errors=True)
        return None
    world = world_size(spec)
    on_note("note", f"predicted on {world or 'all'} processes ({backend}, torchrun)")
    shutil.rmtree(work, ignore_errors=True)
    return merged
