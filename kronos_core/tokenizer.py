"""KronosTokenizer: K-line features <-> hierarchical (s1, s2) tokens via BSQ."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch import Tensor

from kronos_core.pretrained import PretrainedMixin
from kronos_core.layers import TransformerBlock, run_blocks
from kronos_core.quantizer import BSQuantizer


class KronosTokenizer(nn.Module, PretrainedMixin):
    """Causal Transformer encoder -> BSQ bits -> causal Transformer decoder.

    Constructor keywords equal the published `config.json` fields. The encoder
    and decoder each hold `n_*_layers - 1` blocks, as in the published weights.
    """

    def __init__(self, d_in: int, d_model: int, n_heads: int, ff_dim: int, n_enc_layers: int,
                 n_dec_layers: int, ffn_dropout_p: float, attn_dropout_p: float, resid_dropout_p: float,
                 s1_bits: int, s2_bits: int, beta: float, gamma0: float, gamma: float, zeta: float,
                 group_size: int):
        super().__init__()
        self._remember_config({k: v for k, v in locals().items() if k not in ("self", "__class__")})
        self.d_in = d_in
        self.d_model = d_model
        self.s1_bits = s1_bits
        self.s2_bits = s2_bits
        self.codebook_dim = s1_bits + s2_bits
        self.recompute_every = 0

        def block() -> TransformerBlock:
            return TransformerBlock(d_model, n_heads, ff_dim, ffn_dropout_p, attn_dropout_p, resid_dropout_p)

        self.embed = nn.Linear(d_in, d_model)
        self.head = nn.Linear(d_model, d_in)
        self.encoder = nn.ModuleList([block() for _ in range(n_enc_layers - 1)])
        self.decoder = nn.ModuleList([block() for _ in range(n_dec_layers - 1)])
        self.quant_embed = nn.Linear(d_model, self.codebook_dim)
        self.post_quant_embed_pre = nn.Linear(s1_bits, d_model)
        self.post_quant_embed = nn.Linear(self.codebook_dim, d_model)
        self.tokenizer = BSQuantizer(s1_bits, s2_bits, beta, gamma0, gamma, zeta, group_size)

    def set_activation_checkpointing(self, every_n: int) -> None:
        """Recompute every n-th block in backward (0 = off, 1 = all blocks)."""
        self.recompute_every = int(every_n)

    def _encode_latent(self, x: Tensor) -> Tensor:
        z = run_blocks(self.encoder, self.embed(x), recompute_every=self.recompute_every)
        return self.quant_embed(z)

    def _decode_latent(self, z: Tensor, last: int | None = None) -> Tensor:
        if last is None or len(self.decoder) == 0 or torch.is_grad_enabled():
            out = run_blocks(self.decoder, z, recompute_every=self.recompute_every)
            return self.head(out if last is None else out[:, -last:])
        # Only the tail is read: the last block computes its queries, attention and feed-forward for the tail.
        hidden = run_blocks(self.decoder[:-1], z)
        return self.head(self.decoder[-1].forward_tail(hidden, min(last, z.shape[1])))

    def forward(self, x: Tensor):
        """Training forward: ((rec_from_s1, rec_from_all), bsq_loss, quantized bits, indices)."""
        bsq_loss, quantized, indices = self.tokenizer(self._encode_latent(x))
        rec_s1 = self._decode_latent(self.post_quant_embed_pre(quantized[:, :, :self.s1_bits]))
        rec_all = self._decode_latent(self.post_quant_embed(quantized))
        return (rec_s1, rec_all), bsq_loss, quantized, indices

    def indices_to_bits(self, x, half: bool = False) -> Tensor:
        """Rebuild the scaled +-1 bits from indices (least significant bit first)."""
        if half:
            first, second = x
            masks = [2 ** torch.arange(bits, device=first.device, dtype=torch.long)
                     for bits in (self.s1_bits, self.s2_bits)]
            bits = torch.cat([(first.unsqueeze(-1) & masks[0]) != 0, (second.unsqueeze(-1) & masks[1]) != 0], dim=-1)
        else:
            mask = 2 ** torch.arange(self.codebook_dim, device=x.device, dtype=torch.long)
            bits = (x.unsqueeze(-1) & mask) != 0
        return (bits.float() * 2 - 1) * (1.0 / math.sqrt(self.codebook_dim))

    def encode(self, x: Tensor, half: bool = False):
        """Features [B, T, d_in] -> indices; with half=True a list [s1_ids, s2_ids]."""
        _, _, indices = self.tokenizer(self._encode_latent(x), half=half, collect_metrics=False)
        return indices

    def decode(self, x, half: bool = False, last: int | None = None) -> Tensor:
        """Indices (or [s1_ids, s2_ids] with half=True) -> features [B, T, d_in]; with `last`, only the last
        `last` positions [B, last, d_in] (the causal decoder's tail, at less cost: see _decode_latent)."""
        bits = self.indices_to_bits(x, half)
        return self._decode_latent(self.post_quant_embed(bits.to(self.post_quant_embed.weight.dtype)), last)
