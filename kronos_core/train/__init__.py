"""Fine-tuning the Kronos predictor and tokenizer: config, trainer, checkpoints, torchrun entry.

    from kronos_core.train import TrainConfig, Trainer
    summary = Trainer(TrainConfig(model_size="small", data=["prices/"])).fit()

Multi-process: ``torchrun --nproc-per-node N -m kronos_core.train --config run.toml``.
"""

from __future__ import annotations

from kronos_core.deferred import lazy_exports

# Loaded on first use (as kronos_core's own names): a TrainConfig alone, for a report or a config file, does not
# import the Trainer and torch.
_EXPORTS = {
    "checkpoint_path": "kronos_core.train.train_state",
    "load_checkpoint": "kronos_core.train.train_state",
    "TrainConfig": "kronos_core.train.config",
    **{name: "kronos_core.train.records" for name in ("PHASES", "EvalRecord", "PhaseMeter", "StepRecord",
                                                        "TrainSummary")},
    "Trainer": "kronos_core.train.trainer",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
