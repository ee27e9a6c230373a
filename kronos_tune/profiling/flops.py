"""Model FLOPs per token and MFU (model FLOPs utilization).

Training FLOPs per token = 6 N + 12 L H Q T (the PaLM appendix B estimate,
as nanoGPT's `estimate_mfu` uses it): N = parameters outside embedding tables,
L layers, H heads, Q head dimension, T tokens per sequence. The first term is
the matmuls of forward (2N) and backward (4N); the second the attention scores
and weighted sums. Forward-only work (prediction) is a third of it.
"""

from __future__ import annotations

import torch.nn as nn

from kronos_core.model import Kronos


def non_embedding_parameters(model: nn.Module) -> int:
    """Parameters outside nn.Embedding tables (lookups cost no matmul FLOPs)."""
    embedded = sum(p.numel() for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters())
    return sum(p.numel() for p in model.parameters()) - embedded


def train_flops_per_token(model: Kronos, sequence_tokens: int) -> float:
    n = non_embedding_parameters(model)
    head_dim = model.d_model // model.n_heads
    return 6.0 * n + 12.0 * model.n_layers * model.n_heads * head_dim * sequence_tokens


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float | None) -> float | None:
    """Achieved model FLOP/s over the device's peak; None where the peak is unknown."""
    if not peak_flops or tokens_per_s <= 0:
        return None
    return tokens_per_s * flops_per_token / peak_flops
