"""`kronos-tune predict --nproc N [--nnodes ...]`: ranks that claim chunks, so a faster rank takes more.

The parent writes each unfinished chunk's inputs into the job's work folder (`workdir.py`), starts torchrun
on `kronos_tune.predict.ranks` (`kronos_core.launch`; `--max-restarts` passed through) and follows the
ranks' events: a chunk finished (rank, series, seconds) drives the progress, rank 0's `finished` says every
chunk is in. The ranks take chunk numbers from a counter on a TCPStore of torch.distributed hosted by
rank 0 (the rendezvous host) and each writes its own parts and `done/` records; the records are the
truth after any restart, so a restarted group (or a `--resume`) predicts only what is missing, and a rank
that dies loses only its chunk in flight. On several nodes the work folder (beside --out) must be on
storage every node shares: the ranks check it with marker files before any prediction.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from kronos_core.launch import LaunchResult, LaunchSpec, run_launch, torchrun_command, torchrun_env
from kronos_core.predict.spec import PredictorSpec
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.chunk_run import ChunkSettings
from kronos_tune.predict.job_state import JobOutcome, JobProgress, JobProgressCallback
from kronos_tune.predict.chunks import write_chunk_inputs
from kronos_tune.predict.series import LoadedSeries
from kronos_tune.predict.workdir import DoneChunk, WorkFolder

JOB_FILE = "job.json"
RANKS_MODULE = "kronos_tune.predict.ranks"  # what torchrun starts on every rank


def world_size(spec: LaunchSpec) -> int | None:
    """Processes over all nodes (None when the node count is a MIN:MAX range)."""
    try:
        return spec.nproc * int(spec.nnodes or "1")
    except ValueError:
        return None


def check_shards(spec: LaunchSpec, device: str) -> None:
    if device == "cuda" and spec.nproc > torch.cuda.device_count():
        raise KronosTuneError(f"--nproc {spec.nproc} on CUDA but {torch.cuda.device_count()} devices are visible; "
                              f"start at most one process per GPU")


def rank_job(spec: PredictorSpec, settings: ChunkSettings) -> dict:
    """What every rank reads from the job file besides the work folder and the chunk count: the predictor
    (the resolved folders: a rank never looks a hub id up itself) and the chunk settings."""
    return {"predictor": spec.to_dict(), "device": spec.device.split(":")[0], "settings": settings.to_dict()}


def _where(spec: LaunchSpec) -> str:
    return f"--nproc {spec.nproc}" + (f" --nnodes {spec.nnodes}" if spec.multi_node else "")


def run_ranks(spec: LaunchSpec, job: dict, work: WorkFolder, source: Iterable[tuple[int, LoadedSeries]],
              finished: dict[int, DoneChunk], note: Callable[[str, str], None],
              on_progress: JobProgressCallback | None, on_series: Callable[[LoadedSeries], None] | None = None,
              command_name: str = "predict", on_event: Callable[[dict], None] | None = None) -> JobOutcome | None:
    """Every chunk of `source` ((index, series) in order) predicted by the ranks that `job` (`rank_job`)
    describes; `on_series` sees each chunk's series as its inputs are written, `on_event` every event of the
    ranks (the benchmark times its runs from them). None on a node other than the one running rank 0."""
    prepared = write_chunk_inputs(job, work, source, finished, on_series)
    job, chunks, todo = prepared.job, prepared.chunks, prepared.todo
    series_total, resumed_series = prepared.series_total, prepared.resumed_series
    job_file = work.path / JOB_FILE
    job_file.write_text(json.dumps(job, indent=1))
    command = torchrun_command(spec, RANKS_MODULE, [str(job_file)])
    started = time.perf_counter()
    ranks: dict[int, tuple[int, float]] = {}
    done = [resumed_series, 0]  # series finished, clipped volume values
    ready: list[int] = []

    restarts: set[int] = set()

    def on_rank_event(event: dict) -> None:
        if on_event is not None:
            on_event(event)
        kind = event.get("event")
        attempt = int(event.get("attempt", 0))
        if kind == "ready" and attempt > 0 and attempt not in restarts:
            restarts.add(attempt)
            note("note", f"torchrun restarted the ranks after a failure (restart {attempt} of {spec.max_restarts}); "
                         f"they continue with the {event.get('chunks')} unfinished chunks of {chunks}")
        if kind == "ready" and spec.multi_node:
            ready.append(int(event.get("rank", -1)))
            if len(ready) == spec.nproc:
                listed = ", ".join(map(str, sorted(ready)))
                note("note", f"rendezvous done: rank{'s' if len(ready) > 1 else ''} {listed} of "
                             f"{event.get('world')} ready on this node")
        elif kind == "chunk":
            rank = int(event["rank"])
            count, seconds = ranks.get(rank, (0, 0.0))
            ranks[rank] = (count + int(event["series"]), seconds + float(event["seconds"]))
            done[0] += int(event["series"])
            done[1] += int(event.get("negative", 0))
            if on_progress is not None:
                on_progress(JobProgress(done[0], series_total, resumed_series, time.perf_counter() - started,
                                        dict(ranks)))

    if todo:
        result = run_launch(command, on_event=on_rank_event, env=torchrun_env(spec))
        if result.stopped:
            raise KronosTuneError(f"{command_name}: stopped before every chunk was finished; "
                                  f"{work.kept_note(resumable=True)}")
        if not result.ok:
            raise KronosTuneError(f"{command_name} {_where(spec)}: {failure_line(spec, result)}; the other ranks were "
                                  f"stopped; {work.kept_note(resumable=True)}")
        if not any(e.get("event") == "finished" for e in result.events):
            note("note", "this node's ranks finished; the node running rank 0 writes the output")
            return None
        note("note", f"predicted on {world_size(spec) or 'all'} processes "
                     f"({'NCCL' if job['device'] == 'cuda' else 'gloo'}, torchrun), chunks claimed by speed")
    return JobOutcome(series_total, chunks, chunks - len(todo), 0, 0.0, done[1], work.path, None, ranks={},
                      resumed_series=resumed_series)


def failure_line(spec: LaunchSpec, result: LaunchResult) -> str:
    """Why the ranks failed, in one line (what the error after "predict --nproc N: " says)."""
    failures = torchrun_failures(result.tail)
    # A rank killed by a signal (kill -9, the out-of-memory killer) says nothing itself; what its peers then
    # report (gloo's "Connection closed by peer") follows from it, so it is named first. SIGTERM is how
    # torchrun stops the other ranks: not a cause.
    killed = next((f for f in failures if f.signal not in (None, "SIGTERM")), None)
    if killed is not None:
        return killed.describe()
    errors = result.error_events()
    if errors:
        first = errors[0]
        return f"rank {first.get('rank')} failed: {first.get('message')}"
    if spec.multi_node and any("RendezvousConnectionError" in line for line in result.tail):
        # the node whose agent hosts the rendezvous store (whichever bound the endpoint first) went away
        return (f"torchrun exited with code {result.returncode}: the connection to the rendezvous store was lost "
                f"(the node hosting it at the rendezvous endpoint stopped or is unreachable)")
    if failures:
        return failures[0].describe()
    last = next((line.strip() for line in reversed(result.tail) if line.strip()), "no message")
    return f"torchrun exited with code {result.returncode} ({last[:200]})"


@dataclass(frozen=True)
class RankFailure:
    """One failed rank in torchrun's failure summary."""

    rank: str
    exitcode: int | None
    pid: str | None

    @property
    def signal(self) -> str | None:
        """The signal's name for a rank killed by one, else None."""
        if self.exitcode is None or self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def describe(self) -> str:
        """"rank 1 was killed by SIGKILL (pid 123)", "rank 0 exited with code 1 (pid 123)"."""
        how = (f"was killed by {self.signal}" if self.signal is not None
               else f"exited with code {self.exitcode if self.exitcode is not None else '?'}")
        return f"rank {self.rank} {how}" + (f" (pid {self.pid})" if self.pid else "")


_EXITCODE = re.compile(r"^(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")


def torchrun_failures(tail: list[str]) -> list[RankFailure]:
    """Every failed rank in torchrun's summary, the root cause first (the other failures, listed above it,
    after it):

        Failures:
        [1]:
          rank      : 1 (local_rank: 1)
          exitcode  : -9 (pid: 123) SIGKILL
        Root Cause (first observed failure):
        [0]: ...
    """
    root: list[RankFailure] = []
    others: list[RankFailure] = []
    current, rank = others, None
    for line in tail:
        text = line.strip()
        if text.startswith("Root Cause"):
            current = root
        name, colon, value = text.partition(":")
        name, value = name.strip(), value.strip()
        if colon and name == "rank":
            rank = value.split()[0] if value else "?"
        elif colon and name == "exitcode" and rank is not None:
            match = _EXITCODE.match(value)
            current.append(RankFailure(rank, int(match.group(1)) if match else None,
                                       match.group(2) if match else None))
            rank = None
    return root + others


__all__ = ["RANKS_MODULE", "RankFailure", "check_shards", "failure_line", "rank_job", "run_ranks", "torchrun_failures",
           "world_size"]
