"""The old name of kronos_tune.benchmark, kept for one release: its public names, loaded on first use.

The modules moved (protocol/plan.py -> benchmark/tasks.py and train|predict/trial_list.py, records.py ->
results.py, runner.py -> run/runner.py, ...; docs/upgrading.md lists them); import them from
kronos_tune.benchmark. bench_decisions is now the developer benchmark `python -m benchmarks.decisions`.
"""

from __future__ import annotations

from typing import Any

from kronos_tune import benchmark

__all__ = list(benchmark.__all__)


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(benchmark, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
