"""Put first on PYTHONPATH by benchmarks.planted_trials and benchmarks.planted_ranks: every Python process
imports this module at start. In a benchmark trial worker or a predict rank (the product's own modules, started
as `python -m MODULE`), it hands over to the planting module before the product's code runs; any other process
is left alone."""

import importlib
import sys

PLANTERS = {"kronos_tune.benchmark.run.trial_worker": "benchmarks.planted_trials",
            "kronos_tune.predict.ranks": "benchmarks.planted_ranks"}


def _started_module() -> str | None:
    """MODULE of `python [-u] -m MODULE ...`; None for a script, `-c` or an interactive start."""
    argv = getattr(sys, "orig_argv", [])
    for index, word in enumerate(argv[1:], start=1):
        if word == "-m":
            return argv[index + 1] if index + 1 < len(argv) else None
        if not word.startswith("-") or word == "-c":
            return None
    return None


_planter = PLANTERS.get(_started_module() or "")
if _planter:
    importlib.import_module(_planter).plant()
