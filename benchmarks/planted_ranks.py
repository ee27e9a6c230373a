"""The claiming ranks of `kronos-tune predict --nproc N` with a planted slow or dying rank (tests, benchmarks).

    python -m benchmarks.planted_ranks predict --nproc 2 ...     # the CLI, its ranks started from this module

The product's rank loop (`kronos_tune.predict.ranks`) takes `RankHooks`; this module is the entry point that
passes them, read from two variables that only it reads:

- KRONOS_BENCH_SLOW_RANK=RANK:FACTOR makes that rank FACTOR times slower (it sleeps FACTOR - 1 times each
  chunk's prediction time and counts the sleep), to measure how the claiming shares work.
- KRONOS_TEST_DIE_RANK=RANK:CHUNKS makes that rank kill itself (SIGKILL) on the group's first attempt only
  (TORCHELASTIC_RESTART_COUNT 0), once it has finished CHUNKS chunks and claimed the next one, so tests can
  check what a restarted group keeps and redoes.

`use_planted_ranks()` makes this process's sharded jobs start their ranks from here (what the CLI form above
does before it runs the command); the variables then reach the ranks through the environment. Run it from
the repository root, so the ranks can import `benchmarks`.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from benchmarks import run_kronos_tune

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


def before_chunk(rank: int, finished_here: int) -> None:
    limit = dies_after(rank)
    if limit is not None and finished_here >= limit:
        os.kill(os.getpid(), signal.SIGKILL)  # a chunk claimed and in flight


def after_chunk(rank: int, seconds: float) -> float:
    factor = slow_factor(rank)
    if factor > 1:
        time.sleep((factor - 1) * seconds)
        return seconds * factor
    return seconds


def use_planted_ranks() -> None:
    """Sharded jobs of this process start their ranks from this module."""
    from kronos_tune.predict import shards

    shards.RANKS_MODULE = MODULE


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0].endswith(".json"):  # torchrun starting a rank
        from kronos_tune.predict.ranks import RankHooks, main as rank_main

        return rank_main(args, RankHooks(before_chunk=before_chunk, after_chunk=after_chunk), MODULE)
    use_planted_ranks()
    return run_kronos_tune(args)


if __name__ == "__main__":
    sys.exit(main())
