"""Models, optimizer, scheduler, autocast and the parts of a training step for a TrainConfig.

``build_training`` and the step's parts (``forward_backward``, ``optimizer_step``, ``evaluate_sums``) are what
the Trainer runs and what the memory estimate traces on fake tensors (kronos_tune.autobatch.train_probes), so the
two cannot drift apart; only where the batches come from differs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager

import torch
import torch.nn as nn

from kronos_core.errors import KronosError, one_line
from kronos_core.model import Kronos
from kronos_core.sizes import build_model, build_tokenizer
from kronos_core.tokenizer import KronosTokenizer
from kronos_core.train.config import TrainConfig
from kronos_core.train.fsdp import apply_fsdp
from kronos_core.train.steps import Batch, PredictorSteps, TokenizerSteps

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def build_models(config: TrainConfig) -> tuple[nn.Module, KronosTokenizer | None]:
    """(model to train, frozen tokenizer or None), on CPU.

    Weights come from `tokenizer_dir` / `predictor_dir` when given, else a
    random init of `model_size` seeded with `seed`.
    """
    if config.tokenizer_dir:
        tokenizer = KronosTokenizer.from_pretrained(config.tokenizer_dir)
    else:
        tokenizer = build_tokenizer(config.model_size, seed=config.seed)
    if config.what == "tokenizer":
        return tokenizer, None
    if config.predictor_dir:
        model = Kronos.from_pretrained(config.predictor_dir)
    else:
        model = build_model(config.model_size, seed=config.seed)
    if (tokenizer.s1_bits, tokenizer.s2_bits) != (model.s1_bits, model.s2_bits):
        raise KronosError(f"tokenizer has s1/s2 bits {tokenizer.s1_bits}/{tokenizer.s2_bits} but the predictor "
                          f"expects {model.s1_bits}/{model.s2_bits}; pair tokenizer_dir with a matching predictor")
    tokenizer.eval()
    tokenizer.requires_grad_(False)
    return model, tokenizer


def build_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW as in the reference; `auto` picks the fused kernel when this device has one, else foreach."""
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = dict(lr=config.effective_lr, betas=config.betas, weight_decay=config.weight_decay)
    impl = config.optimizer_impl
    if impl in ("auto", "fused"):
        try:
            return torch.optim.AdamW(params, fused=True, **kwargs)
        except (RuntimeError, ValueError) as error:
            if impl == "fused":
                raise KronosError(f"optimizer_impl='fused' is not available for {device} in this PyTorch "
                                  f"({one_line(error, typed=False)}); "
                                  "use optimizer_impl = \"auto\" or \"foreach\"") from None
    if impl in ("auto", "foreach"):
        return torch.optim.AdamW(params, foreach=True, **kwargs)
    return torch.optim.AdamW(params, foreach=False, **kwargs)


def build_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig, total_steps: int):
    """OneCycleLR over all optimizer steps (stepped per optimizer step), or ReduceLROnPlateau on val loss."""
    if config.schedule == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=config.plateau_factor,
                                                          patience=config.plateau_patience)
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=config.effective_lr, total_steps=max(total_steps, 2),
                                               pct_start=config.pct_start, div_factor=config.div_factor)


def autocast_context(config: TrainConfig, device: torch.device) -> ContextManager:
    dtype = AMP_DTYPES.get(config.amp)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def check_amp_support(config: TrainConfig, device: torch.device) -> None:
    if config.amp == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise KronosError(f"amp='bf16' but {torch.cuda.get_device_name(device)} has no bfloat16 support; "
                          f"use amp = \"fp16\" or \"none\"")


@dataclass
class TrainParts:
    """What a training run trains with: the model (FSDP: this rank's shards), the frozen tokenizer of a
    predictor run, the loss and evaluation of the model trained, the optimizer."""

    model: nn.Module
    tokenizer: KronosTokenizer | None
    steps: PredictorSteps | TokenizerSteps
    optimizer: torch.optim.Optimizer


def build_training(config: TrainConfig, device: torch.device, world_size: int = 1, mesh: Any = None) -> TrainParts:
    """Models with the config's activation checkpointing applied, sharded (parallelism "fsdp": over
    `world_size` ranks, on `mesh` when given) or moved to `device`, and the optimizer over them."""
    model, tokenizer = build_models(config)  # on the CPU: moving them there is nothing (and fake tensors refuse it)
    model.set_activation_checkpointing(config.activation_checkpointing_blocks)
    if config.parallelism == "fsdp":
        # Sharded on the CPU copy: each rank moves only its shard to the device, never the whole model.
        model = apply_fsdp(model, config, device, world_size, mesh=mesh)
    elif device.type != "cpu":
        model = model.to(device)
    steps: PredictorSteps | TokenizerSteps
    if tokenizer is not None:
        if device.type != "cpu":
            tokenizer.to(device)
        steps = PredictorSteps(tokenizer, config.teacher_forcing)
    else:
        steps = TokenizerSteps()
    return TrainParts(model, tokenizer, steps, build_optimizer(model, config, device))


def build_grad_scaler(config: TrainConfig, device: torch.device) -> torch.amp.GradScaler:
    return torch.amp.GradScaler(device.type, enabled=config.amp == "fp16")


def forward_backward(parts: TrainParts, train_model: nn.Module, batch: Batch, config: TrainConfig,
                     device: torch.device, scaler: torch.amp.GradScaler, phases: Any) -> torch.Tensor:
    """One micro-batch's forward (under autocast) and backward of its share of the step's loss; the loss.
    `phases.phase(name)` (a context manager) brackets each."""
    with phases.phase("forward"), autocast_context(config, device):
        loss = parts.steps.loss(train_model, parts.model, batch)
    with phases.phase("backward"):
        scaler.scale(loss / config.accumulation_steps).backward()
    return loss


def optimizer_step(parts: TrainParts, scaler: torch.amp.GradScaler, max_norm: float) -> tuple[torch.Tensor, bool]:
    """Unscale, clip, step and zero the gradients: (the gradient norm, whether the scaler skipped the step)."""
    optimizer = parts.optimizer
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(parts.model.parameters(), max_norm)
    scale_before = scaler.get_scale() if scaler.is_enabled() else 1.0
    scaler.step(optimizer)
    scaler.update()
    skipped = scaler.is_enabled() and scaler.get_scale() < scale_before
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, skipped


def evaluate_sums(parts: TrainParts, x: torch.Tensor, stamp: torch.Tensor, config: TrainConfig,
                  device: torch.device, per_window: bool = False) -> torch.Tensor:
    """The evaluation sums of one batch (`per_window`: one row per window), in eval mode without gradients
    (the training mode is restored)."""
    model = parts.model
    was_training = model.training
    model.eval()
    try:
        batch = parts.steps.prepare(x, stamp)
        with torch.no_grad(), autocast_context(config, device):
            if per_window:
                return parts.steps.window_sums(model, batch)
            return parts.steps.eval_sums(model, batch)
    finally:
        model.train(was_training)
