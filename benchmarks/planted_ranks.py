"""The claiming ranks of `kronos-tune predict --nproc N` with a planted slow or dying rank (tests, benchmarks).

    python -m benchmarks.planted_ranks predict --nproc 2 ...     # the CLI, its ranks planted from this module

Nothing of the product is asked to plant anything: `use_planted_ranks()` puts benchmarks/planted/ (a
`sitecustomize` module, which every Python process imports at start) and the repository root first on
PYTHONPATH, and in each rank (`python -m kronos_tune.predict.ranks JOB.json` under torchrun) `plant()` then
wraps `kronos_tune.predict.chunk_run.predict_chunk`, before the rank's code runs, with what two variables that
only this module reads ask for:

- KRONOS_BENCH_SLOW_RANK=RANK:FACTOR makes that rank FACTOR times slower (it sleeps FACTOR - 1 times each
  chunk's prediction time and counts the sleep), to measure how the claiming shares work.
- KRONOS_TEST_DIE_RANK=RANK:CHUNKS makes that rank kill itself (SIGKILL) on the group's first attempt only
  (TORCHELASTIC_RESTART_COUNT 0), once it has finished CHUNKS chunks and claimed the next one, so tests can
  check what a restarted group keeps and redoes.

The variables reach the ranks through the environment.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from benchmarks import run_kronos_tune
from benchmarks.planted_trials import REPO_ROOT, SHIM_FOLDER

SLOW_RANK_KNOB = "KRONOS_BENCH_SLOW_RANK"
DIE_RANK_KNOB = "KRONOS_TEST_DIE_RANK"
MODULE = "benchmarks.planted_ranks"


def slow_factor(rank: int) -> float:
    """The planted slowdown of this rank (1.0: none)."""
    value = os.environ.get(SLOW_RANK_KNOB, "")
    if not value:
        return 1.0
    which, _, factor = value.partition(":")
    return float(factor or 1.0) if int(which) == rank else 1.0


def dies_after(rank: int) -> int | None:
    """The planted death: chunks this rank finishes before it kills itself (None: it never does)."""
    value = os.environ.get(DIE_RANK_KNOB, "")
    if not value or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    which, _, chunks = value.partition(":")
    return int(chunks or 0) if int(which) == rank else None


def plant() -> None:
    """In a rank's process, before its code runs: `predict_chunk` wrapped with this rank's planted death (after
    it claimed a chunk, before it predicts it) and slowdown (a sleep after it, counted in the chunk's time)."""
    from kronos_tune.predict import chunk_run

    rank = int(os.environ.get("RANK", "0"))
    limit, factor, predict = dies_after(rank), slow_factor(rank), chunk_run.predict_chunk
    finished_here = 0

    def planted(*args: Any, **kwargs: Any) -> Any:
        nonlocal finished_here
        if limit is not None and finished_here >= limit:
            os.kill(os.getpid(), signal.SIGKILL)  # a chunk claimed and in flight
        started = time.perf_counter()
        done = predict(*args, **kwargs)
        if factor > 1:
            time.sleep((factor - 1) * (time.perf_counter() - started))
        finished_here += 1
        return done

    chunk_run.predict_chunk = planted


def use_planted_ranks() -> None:
    """The predict ranks this process starts (and its children start) are planted from this module."""
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    wanted = [str(SHIM_FOLDER), str(REPO_ROOT)]
    os.environ["PYTHONPATH"] = os.pathsep.join([*wanted, *(path for path in paths if path and path not in wanted)])


def main(argv: list[str] | None = None) -> int:
    use_planted_ranks()
    return run_kronos_tune(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
