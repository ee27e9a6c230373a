"""What a finished (or partial) benchmark means, from its results alone.

``summarize(report, preset)`` returns a new report: the given one's trials with
what is missing, whether the run is partial, and the sections its task derives
(train/summary.py, predict/summary.py). The runner calls it at the end of a run;
``kronos-tune report`` calls it on a results.jsonl from any machine (nothing
here touches a device).
"""

from __future__ import annotations

import copy

from kronos_tune.benchmark.report.estimate import align_deltas
from kronos_tune.benchmark.results import BenchmarkReport
from kronos_tune.benchmark.tasks import get
from kronos_tune.presets import Preset


def summarize(report: BenchmarkReport, preset: Preset | None) -> BenchmarkReport:
    """A copy of `report` with its derived sections filled (`report` itself is left as it was)."""
    summary = copy.deepcopy(report)
    names = {t.name for t in summary.trials}
    summary.missing = [name for name in summary.planned if name not in names]
    summary.partial = bool(summary.cancelled or summary.missing)
    get(summary.task).decide(summary, preset)
    align_deltas(summary.trials)  # every delta from the figures shown beside it, once all estimates are set
    return summary
