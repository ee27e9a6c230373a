"""autobatch: the largest batch size that fits a memory budget, measured with the real step.

    from kronos_tune import autobatch
    result = autobatch(step_factory, budget_bytes=2 << 30, margin=0.1)
    result.batch_size, result.accumulation_steps, result.probes

``kronos_tune.autobatch`` is this package and is itself callable as the
function (``kronos_tune.autobatch(...)`` == ``kronos_tune.autobatch.autobatch(...)``),
so ``from kronos_tune import autobatch`` works whichever was imported first.

* ``search``: the generic core (``autobatch``, ``AutobatchResult``, ``Probe``, ``ProbeStep``);
* ``train_task``: step/eval factories for a preset's fine-tuning workload (kronos_core's Trainer);
* ``predict_task``: the prediction chunk size (``max_batch_size``) for a preset's predict workload;
* ``render``: Rich summary, terminal plot, TOML snippet.

``python -m benchmarks.autobatch`` (repository root) compares the pick with the true maximum.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from kronos_tune.autobatch.search import (
    AutobatchResult,
    PeakModel,
    Probe,
    ProbeStep,
    SeriesFit,
    autobatch,
    is_out_of_memory,
    split_effective_batch,
    validate_margin,
)

__all__ = [
    "AutobatchResult",
    "PeakModel",
    "Probe",
    "ProbeStep",
    "SeriesFit",
    "autobatch",
    "is_out_of_memory",
    "split_effective_batch",
    "validate_margin",
]


class _CallablePackage(types.ModuleType):
    """Calling the package calls ``autobatch``: the package and the function share a name."""

    def __call__(self, *args: Any, **kwargs: Any) -> AutobatchResult:
        return autobatch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
