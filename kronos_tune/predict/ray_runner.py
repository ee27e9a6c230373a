"""`kronos-tune predict --runner ray`: the chunks predicted by Ray Data actors, for a cluster that runs Ray.

The same pipeline as one process and as torchrun's ranks: the parent writes each unfinished chunk's inputs
into the work folder (`chunks.write_chunk_inputs`, as `shards.run_ranks` does), then a Ray dataset of the
unfinished chunk numbers goes through `map_batches` on a pool of actors. Each actor builds the predictor once
(`build_predictor` of the job's spec) and, per chunk, loads its inputs, runs `predict_chunk` and writes the
part and its `done/` record (`parts.write_part`): the records are the truth for `--resume`, whoever wrote them.
The parent only counts the chunks coming back, for the progress.

GPUs are actor resources: on CUDA every actor asks Ray for one GPU (Ray sets its CUDA_VISIBLE_DEVICES, so
the actor predicts on its cuda:0); on the CPU one CPU. A dead actor (a crash, the out-of-memory killer,
kill -9) is restarted by Ray and its chunk predicted again (Ray Data's own rule, which newer Rays no longer
let a caller change); an error an actor raises stops the run in one line that keeps every finished chunk. The work folder must be on storage every node of the cluster
mounts at the same path, and every node needs kronos-tune and the model folders.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from kronos_core.errors import one_line
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.chunks import write_chunk_inputs
from kronos_tune.predict.job_state import JobOutcome, JobProgress, JobProgressCallback
from kronos_tune.predict.config import require_ray
from kronos_tune.predict.series import LoadedSeries
from kronos_tune.predict.workdir import DoneChunk, WorkFolder

@contextmanager
def connected(address: str | None) -> Iterator[Any]:
    """Ray, connected: the connection this process already holds (left open), or one made here for the run and
    closed after it (`address` as ray.init takes it: None is $RAY_ADDRESS, else a Ray cluster started on this
    machine, else a Ray started for the run; `local` always the last)."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False, include_dashboard=False)
    except Exception as error:  # a version mismatch, a refused client, ...: Ray's own words, in one line
        raise KronosTuneError(f"--ray-address {address or 'local'}: could not connect to Ray "
                              f"({one_line(error, typed=False)[:300]})") from None
    try:
        yield ray
    finally:
        ray.shutdown()


class ActorNumbers:
    """Numbers the actors in the order they start (the `rank` of their done records): a restarted actor
    takes the next number."""

    def __init__(self) -> None:
        self.count = 0

    def next(self) -> int:
        self.count += 1
        return self.count - 1


class ChunkWorker:
    """One actor of the pool: the predictor built once, then one chunk per call."""

    def __init__(self, job: dict, numbers: Any) -> None:
        import ray

        from kronos_core.predict.spec import PredictorSpec, build_predictor
        from kronos_tune.predict.chunk_run import ChunkSettings

        spec = PredictorSpec.from_dict(job["predictor"])
        self.predictor = build_predictor(spec.on("cuda:0" if job["device"] == "cuda" else "cpu"))
        self.work = WorkFolder(Path(job["work"]), {})
        self.settings = ChunkSettings.from_dict(job["settings"])
        self.rank = int(ray.get(numbers.next.remote()))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from kronos_tune.predict.chunk_run import predict_chunk
        from kronos_tune.predict.parts import write_part
        from kronos_tune.predict.series import load_saved_series

        chunk = int(batch["chunk"][0])
        try:
            series = load_saved_series(self.work.inputs(chunk))
            started = time.perf_counter()
            table, negative = predict_chunk(self.predictor, series, self.settings)
            seconds = time.perf_counter() - started
            write_part(self.work, chunk, table, series, self.rank, seconds)
        except Exception as error:  # the parent says it in one line (Ray Data would keep only its own words)
            return self._row(chunk, 0, 0.0, 0, one_line(error))
        return self._row(chunk, len(series), seconds, negative, "")

    def _row(self, chunk: int, series: int, seconds: float, negative: int, error: str) -> dict[str, np.ndarray]:
        return {"chunk": np.array([chunk]), "rank": np.array([self.rank]), "series": np.array([series]),
                "seconds": np.array([seconds]), "negative": np.array([negative]), "error": np.array([error])}


def actor_count(ray: Any, requested: int | None, device: str, address: str | None) -> int:
    """The actors to start: --ray-actors, else one per GPU (CUDA) or CPU of the cluster; never more than the
    cluster has, where Ray would wait for them forever."""
    kind = "GPU" if device == "cuda" else "CPU"
    have = int(ray.cluster_resources().get(kind, 0))
    where = f"the Ray cluster at {address}" if address not in (None, "local") else "this machine's Ray"
    if have < 1:
        raise KronosTuneError(f"--runner ray on {device}: {where} has no {kind}; use --device cpu or a cluster "
                              f"with GPUs")
    if requested is not None and requested > have:
        raise KronosTuneError(f"--ray-actors {requested}: each actor takes one {kind} and {where} has {have}; "
                              f"ask for at most {have}")
    return requested or have


def run_ray(job: dict, work: WorkFolder, source: Iterable[tuple[int, LoadedSeries]],
            finished: dict[int, DoneChunk], note: Callable[[str, str], None],
            on_progress: JobProgressCallback | None, on_series: Callable[[LoadedSeries], None] | None = None,
            command_name: str = "predict", address: str | None = None, actors: int | None = None) -> JobOutcome:
    """Every chunk of `source` ((index, series) in order) predicted by Ray actors running the job `job`
    (`shards.rank_job`: predictor spec, device, chunk settings); the arguments as `shards.run_ranks`'s, with
    the cluster's `address` (None: Ray's own rule, $RAY_ADDRESS or a Ray on this machine) and the pool's size."""
    require_ray()
    prepared = write_chunk_inputs(job, work, source, finished, on_series)
    ranks: dict[int, tuple[int, float]] = {}
    done = [prepared.resumed_series, 0]  # series finished, clipped volume values
    if prepared.todo:
        with connected(address) as ray:
            count = min(actor_count(ray, actors, job["device"], address), len(prepared.todo))
            started = time.perf_counter()
            try:
                for row in _chunk_rows(ray, prepared.job, prepared.todo, count):
                    rank = int(row["rank"])
                    if row["error"]:
                        raise KronosTuneError(f"{command_name} --runner ray: actor {rank} failed on chunk "
                                              f"{int(row['chunk'])}: {row['error']}; {work.kept_note(resumable=True)}")
                    series, seconds = ranks.get(rank, (0, 0.0))
                    ranks[rank] = (series + int(row["series"]), seconds + float(row["seconds"]))
                    done[0] += int(row["series"])
                    done[1] += int(row["negative"])
                    if on_progress is not None:
                        on_progress(JobProgress(done[0], prepared.series_total, prepared.resumed_series,
                                                time.perf_counter() - started, dict(ranks)))
            except KronosTuneError:
                raise
            except KeyboardInterrupt:
                raise KronosTuneError(f"{command_name}: stopped before every chunk was finished; "
                                      f"{work.kept_note(resumable=True)}") from None
            except Exception as error:  # noqa: BLE001 - whatever Ray raises, it is said in one line
                raise KronosTuneError(f"{command_name} --runner ray: {ray_failure(error)}; "
                                      f"{work.kept_note(resumable=True)}") from None
        note("note", f"predicted by {count} Ray actor{'s' if count > 1 else ''} "
                     f"({'one GPU' if job['device'] == 'cuda' else 'one CPU'} each), chunks taken by speed")
    return JobOutcome(prepared.series_total, prepared.chunks, prepared.chunks - len(prepared.todo), 0, 0.0, done[1],
                      work.path, None, ranks={}, resumed_series=prepared.resumed_series)


def _chunk_rows(ray: Any, job: dict, todo: list[int], count: int) -> Iterator[dict[str, Any]]:
    """The rows the actors return, one per chunk, as each chunk finishes."""
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    numbers = ray.remote(num_cpus=0)(ActorNumbers).remote()
    cuda = job["device"] == "cuda"
    # one block per chunk: an actor takes the next chunk when it finishes one, and each comes back at once
    dataset = ray.data.from_items([{"chunk": k} for k in todo], override_num_blocks=len(todo))
    dataset = dataset.map_batches(
        ChunkWorker, batch_size=1, compute=ray.data.ActorPoolStrategy(size=count),
        num_gpus=1 if cuda else 0, num_cpus=0 if cuda else 1,
        fn_constructor_kwargs={"job": job, "numbers": numbers})
    yield from dataset.iter_rows()


_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


def ray_failure(error: BaseException) -> str:
    """What went wrong in Ray, in one line: a dead actor Ray gave up on, or the first error its traceback text
    names that is not Ray's own (an actor's constructor that raised), or Ray's error itself."""
    import ray.exceptions

    if isinstance(error, ray.exceptions.ActorDiedError) or isinstance(error.__cause__, ray.exceptions.ActorDiedError):
        return "a Ray actor died and Ray gave up restarting it"
    for line in str(error).splitlines():
        found = _RAISED.match(line.strip())
        if found and not found.group(1).startswith("ray."):
            return f"an actor failed: {found.group(1).rsplit('.', 1)[-1]}: {found.group(2)[:300]}"
    return one_line(error)[:300]


__all__ = ["ChunkWorker", "actor_count", "connected", "ray_failure", "run_ray"]
