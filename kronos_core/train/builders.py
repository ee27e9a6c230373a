"""Models, optimizer, scheduler and autocast for a TrainConfig."""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch
import torch.nn as nn

from kronos_core.errors import KronosError, one_line
from kronos_core.model import Kronos
from kronos_core.sizes import build_model, build_tokenizer
from kronos_core.tokenizer import KronosTokenizer
from kronos_core.train.config import TrainConfig

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
