"""autobatch: the largest batch size that fits a memory budget, measured with the real step.

    from kronos_tune.autobatch import autobatch
    result = autobatch(step_factory, budget_bytes=2 << 30, margin=0.1)
    result.batch_size, result.accumulation_steps, result.probes

* ``search``: the generic core (``autobatch``, ``AutobatchResult``, ``Probe``, ``ProbeStep``);
* ``train_task``: step/eval factories for a preset's fine-tuning workload (kronos_core's Trainer);
* ``predict_task``: the prediction chunk size (``max_batch_size``) for a preset's predict workload;
* ``render``: Rich summary, terminal plot, TOML snippet.

``python -m benchmarks.autobatch`` (repository root) compares the pick with the true maximum.
"""

from __future__ import annotations

from kronos_tune.autobatch.search import (
    AutobatchResult,
    Probe,
    ProbeStep,
    autobatch,
    is_out_of_memory,
    split_effective_batch,
    validate_margin,
)
from kronos_tune.memory.peak import PeakModel, SeriesFit

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

