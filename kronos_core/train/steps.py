"""What one micro-step computes for each model: batch preparation, training loss, eval sums.

Predictor (reference finetune/train_predictor.py): windows are tokenized by the
frozen tokenizer (``encode(x, half=True)``, fp32, no grad); inputs are all
positions but the last, targets all but the first; the loss is
``model.head.compute_loss(...)[0]`` (mean of the s1 and s2 cross-entropies).
Evaluation always conditions s2 on the true s1 (teacher forcing), so
validation numbers are deterministic whatever ``teacher_forcing`` says.

Tokenizer (reference finetune/train_tokenizer.py): loss
``(mse(rec_s1, x) + mse(rec_all, x) + bsq_loss) / 2``; evaluation reports the
reconstruction MSE of the full-code decoder output (``rec_all``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from kronos_core.model import Kronos
from kronos_core.tokenizer import KronosTokenizer


@dataclass
class Batch:
    """One micro-batch on the training device."""

    x: Tensor  # [B, L, 6] z-scored features
    stamp: Tensor  # [B, L, 5] calendar features
    s1: Tensor | None = None  # [B, L] token ids (predictor only)
    s2: Tensor | None = None

    @property
    def samples(self) -> int:
        return int(self.x.shape[0])


class PredictorSteps:
    """Loss and evaluation of the Kronos predictor on tokenized windows."""

    what = "predictor"
    eval_width = 4  # length of eval_sums

    def __init__(self, tokenizer: KronosTokenizer, teacher_forcing: bool) -> None:
        self.tokenizer = tokenizer
        self.teacher_forcing = teacher_forcing

    def tokens_per_sample(self, window_length: int) -> int:
        return window_length - 1

    @torch.no_grad()
    def prepare(self, x: Tensor, stamp: Tensor) -> Batch:
        # Tokenized in fp32 outside autocast so the ids never depend on the amp setting.
        with torch.autocast(device_type=x.device.type, enabled=False):
            s1, s2 = self.tokenizer.encode(x, half=True)
        return Batch(x, stamp, s1, s2)

    def _forward(self, model: nn.Module, batch: Batch, teacher_forcing: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        assert batch.s1 is not None and batch.s2 is not None
        s1_in, s2_in = batch.s1[:, :-1], batch.s2[:, :-1]
        s1_target, s2_target = batch.s1[:, 1:], batch.s2[:, 1:]
        s1_logits, s2_logits = model(s1_in, s2_in, batch.stamp[:, :-1, :], use_teacher_forcing=teacher_forcing,
                                     s1_targets=s1_target)
        return s1_logits, s2_logits, s1_target, s2_target

    def loss(self, model: nn.Module, head_model: Kronos, batch: Batch) -> Tensor:
        s1_logits, s2_logits, s1_target, s2_target = self._forward(model, batch, self.teacher_forcing)
        loss, _, _ = head_model.head.compute_loss(s1_logits.float(), s2_logits.float(), s1_target, s2_target)
        return loss

    @torch.no_grad()
    def eval_sums(self, model: nn.Module, batch: Batch) -> Tensor:
        """[loss x tokens, s1 correct, s2 correct, tokens] for this batch (summed over ranks later)."""
        s1_logits, s2_logits, s1_target, s2_target = self._forward(model, batch, True)
        s1_logits, s2_logits = s1_logits.float(), s2_logits.float()
        ce_s1 = F.cross_entropy(s1_logits.flatten(0, 1), s1_target.flatten(), reduction="sum")
        ce_s2 = F.cross_entropy(s2_logits.flatten(0, 1), s2_target.flatten(), reduction="sum")
        correct_s1 = (s1_logits.argmax(-1) == s1_target).sum()
        correct_s2 = (s2_logits.argmax(-1) == s2_target).sum()
        tokens = s1_target.numel()
        return torch.stack([(ce_s1 + ce_s2) / 2, correct_s1.double(), correct_s2.double(),
                            torch.tensor(float(tokens), device=s1_logits.device)]).double()

    @torch.no_grad()
    def window_sums(self, model: nn.Module, batch: Batch) -> Tensor:
        """eval_sums of each window of the batch, one row per window ([B, eval_width]): paired comparisons of
        two models on the same windows, from one batched forward."""
        s1_logits, s2_logits, s1_target, s2_target = self._forward(model, batch, True)
        s1_logits, s2_logits = s1_logits.float(), s2_logits.float()
        ce_s1 = F.cross_entropy(s1_logits.transpose(1, 2), s1_target, reduction="none").sum(1)
        ce_s2 = F.cross_entropy(s2_logits.transpose(1, 2), s2_target, reduction="none").sum(1)
        correct_s1 = (s1_logits.argmax(-1) == s1_target).sum(1)
        correct_s2 = (s2_logits.argmax(-1) == s2_target).sum(1)
        tokens = torch.full_like(ce_s1, float(s1_target.shape[1]))
        return torch.stack([(ce_s1 + ce_s2) / 2, correct_s1, correct_s2, tokens], dim=1).double()

    @staticmethod
    def eval_metrics(sums: Tensor) -> dict[str, float]:
        loss_sum, correct_s1, correct_s2, tokens = (float(v) for v in sums)
        tokens = max(tokens, 1.0)
        return {"val_loss": loss_sum / tokens, "s1_accuracy": correct_s1 / tokens,
                "s2_accuracy": correct_s2 / tokens, "val_tokens": tokens}


class TokenizerSteps:
    """Reconstruction + BSQ loss of the tokenizer on raw windows."""

    what = "tokenizer"
    eval_width = 3  # length of eval_sums

    def tokens_per_sample(self, window_length: int) -> int:
        return window_length

    def prepare(self, x: Tensor, stamp: Tensor) -> Batch:
        return Batch(x, stamp)

    def loss(self, model: nn.Module, head_model: KronosTokenizer, batch: Batch) -> Tensor:
        (rec_s1, rec_all), bsq_loss, _, _ = model(batch.x)
        x = batch.x
        return (F.mse_loss(rec_s1.float(), x) + F.mse_loss(rec_all.float(), x) + bsq_loss.float()) / 2

    @torch.no_grad()
    def eval_sums(self, model: nn.Module, batch: Batch) -> Tensor:
        """[squared error of rec_all, squared error of rec_s1, elements]."""
        (rec_s1, rec_all), _, _, _ = model(batch.x)
        x = batch.x
        sq_all = ((rec_all.float() - x) ** 2).sum()
        sq_s1 = ((rec_s1.float() - x) ** 2).sum()
        return torch.stack([sq_all.double(), sq_s1.double(),
                            torch.tensor(float(x.numel()), device=x.device, dtype=torch.float64)])

    @torch.no_grad()
    def window_sums(self, model: nn.Module, batch: Batch) -> Tensor:
        """eval_sums of each window of the batch, one row per window ([B, eval_width])."""
        (rec_s1, rec_all), _, _, _ = model(batch.x)
        x = batch.x
        sq_all = ((rec_all.float() - x) ** 2).flatten(1).sum(1)
        sq_s1 = ((rec_s1.float() - x) ** 2).flatten(1).sum(1)
        elements = torch.full_like(sq_all, float(x[0].numel()))
        return torch.stack([sq_all, sq_s1, elements], dim=1).double()

    @staticmethod
    def eval_metrics(sums: Tensor) -> dict[str, float]:
        sq_all, sq_s1, elements = (float(v) for v in sums)
        elements = max(elements, 1.0)
        mse = sq_all / elements
        return {"val_loss": mse, "recon_mse": mse, "recon_s1_mse": sq_s1 / elements, "val_elements": elements}
