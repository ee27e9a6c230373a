"""autobatch: the largest batch size that fits a memory budget, measured with the real step.

    from kronos_tune.autobatch import autobatch
    result = autobatch(step_factory, budget_bytes=2 << 30, margin=0.1)
    result.batch_size, result.accumulation_steps, result.probes

* ``search``: the generic core (``autobatch``), over ``probes`` (``AutobatchResult``, ``Probe``, ``ProbeStep``, and a
  probe's progress line and the TOML snippet; the Rich tables and plot are commands/autobatch_render.py);
* ``train_probes``: step/eval factories for a preset's fine-tuning workload (kronos_core's Trainer);
* ``predict_probes``: the predict call size (``max_batch_size``) for a preset's predict workload;

``python -m benchmarks.autobatch`` (repository root) compares the pick with the true maximum.
"""

from __future__ import annotations

from kronos_core.deferred import lazy_exports

# Loaded on first use (as kronos_core.train's names): the search loads torch, and a command that only parses its
# flags or checks a rule (kronos_tune.autobatch.maximize) must not.
_EXPORTS = {
    **{name: "kronos_tune.autobatch.probes" for name in ("AutobatchResult", "Probe", "ProbeStep")},
    **{name: "kronos_tune.autobatch.search" for name in ("autobatch", "split_effective_batch")},
    "is_out_of_memory": "kronos_tune.autobatch.runners",
    **{name: "kronos_tune.memory.peak" for name in ("PeakModel", "SeriesFit", "validate_margin")},
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
