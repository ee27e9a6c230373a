"""Fine-tuning the Kronos predictor and tokenizer: config, trainer, checkpoints, torchrun entry.

    from kronos_core.train import TrainConfig, Trainer
    summary = Trainer(TrainConfig(model_size="small", data=["prices/"])).fit()

Multi-process: ``torchrun --nproc-per-node N -m kronos_core.train --config run.toml``.
"""

from kronos_core.train.train_state import checkpoint_path, load_checkpoint
from kronos_core.train.config import TrainConfig
from kronos_core.train.records import PHASES, EvalRecord, PhaseMeter, StepRecord, TrainSummary
from kronos_core.train.trainer import Trainer

__all__ = ["PHASES", "EvalRecord", "PhaseMeter", "StepRecord", "TrainConfig", "TrainSummary", "Trainer", "checkpoint_path",
           "load_checkpoint"]
