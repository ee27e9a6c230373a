"""Model FLOPs per token and MFU (model FLOPs utilization).

Training FLOPs per token = 6 N + 12 L H Q T (the PaLM appendix B estimate,
as nanoGPT's `estimate_mfu` uses it): N = parameters outside embedding tables,
L layers, H heads, Q head dimension, T tokens per sequence. The first term is
the matmuls of forward (2N) and backward (4N); the second the attention scores
and weighted sums. Forward-only work (prediction) is a third of it.

`size_train_flops_per_token` gives the same figure from a size's keywords alone
(kronos_core.sizes.non_embedding_params), so reading a report needs no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kronos_core.sizes import non_embedding_params

if TYPE_CHECKING:
    import torch.nn as nn

    from kronos_core.model import Kronos


def non_embedding_parameters(model: nn.Module) -> int:
    """Parameters outside nn.Embedding tables (lookups cost no matmul FLOPs)."""
    import torch.nn as nn

    embedded = sum(p.numel() for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters())
    return sum(p.numel() for p in model.parameters()) - embedded


def _palm_flops(non_embedding: int, n_layers: int, n_heads: int, head_dim: int, sequence_tokens: int) -> float:
    return 6.0 * non_embedding + 12.0 * n_layers * n_heads * head_dim * sequence_tokens


def train_flops_per_token(model: Kronos, sequence_tokens: int) -> float:
    return _palm_flops(non_embedding_parameters(model), model.n_layers, model.n_heads,
                       model.d_model // model.n_heads, sequence_tokens)


def size_train_flops_per_token(model: dict[str, Any], sequence_tokens: int) -> float:
    """`train_flops_per_token` of the predictor `model` (a size's keywords) would build, without building it."""
    return _palm_flops(non_embedding_params(model), model["n_layers"], model["n_heads"],
                       model["d_model"] // model["n_heads"], sequence_tokens)


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float | None) -> float | None:
    """Achieved model FLOP/s over the device's peak; None where the peak is unknown."""
    if not peak_flops or tokens_per_s <= 0:
        return None
    return tokens_per_s * flops_per_token / peak_flops
