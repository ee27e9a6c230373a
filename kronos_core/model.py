"""Kronos: autoregressive Transformer over (s1, s2) token pairs plus calendar features."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from kronos_core.pretrained import PretrainedMixin
from kronos_core.layers import CrossAttention, LayerCache, RMSNorm, TransformerBlock, run_blocks

DEP_LAYER_HEADS = 4  # fixed in the published architecture, whatever n_heads is


class HierarchicalEmbedding(nn.Module):
    """fusion_proj(cat(emb_s1(s1) * sqrt(d), emb_s2(s2) * sqrt(d)))."""

    def __init__(self, s1_bits: int, s2_bits: int, d_model: int = 256):
        super().__init__()
        self.s1_bits = s1_bits
        self.s2_bits = s2_bits
        self.d_model = d_model
        self.emb_s1 = nn.Embedding(2 ** s1_bits, d_model)
        self.emb_s2 = nn.Embedding(2 ** s2_bits, d_model)
        self.fusion_proj = nn.Linear(2 * d_model, d_model)

    def split_token(self, token_ids: Tensor, s2_bits: int) -> tuple[Tensor, Tensor]:
        """Composite ids -> (high bits s1, low bits s2)."""
        ids = token_ids.long()
        return ids >> s2_bits, ids & ((1 << s2_bits) - 1)

    def forward(self, token_ids) -> Tensor:
        if isinstance(token_ids, (list, tuple)):
            s1_ids, s2_ids = token_ids
        else:
            s1_ids, s2_ids = self.split_token(token_ids, self.s2_bits)
        scale = math.sqrt(self.d_model)
        return self.fusion_proj(torch.cat([self.emb_s1(s1_ids) * scale, self.emb_s2(s2_ids) * scale], dim=-1))


class FixedEmbedding(nn.Module):
    """Sinusoidal table, not trained (used when learn_te is false)."""

    def __init__(self, size: int, d_model: int):
        super().__init__()
        position = torch.arange(size).float().unsqueeze(1)
        div_term = (torch.arange(0, d_model, 2).float() * -(math.log(10000.0) / d_model)).exp()
        table = torch.zeros(size, d_model)
        table[:, 0::2] = torch.sin(position * div_term)
        table[:, 1::2] = torch.cos(position * div_term)
        self.emb = nn.Embedding(size, d_model)
        self.emb.weight = nn.Parameter(table, requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.emb(x).detach()


CALENDAR_SIZES = (("minute", 60), ("hour", 24), ("weekday", 7), ("day", 32), ("month", 13))


class TemporalEmbedding(nn.Module):
    """Sum of minute, hour, weekday, day and month embeddings of each step's timestamp."""

    def __init__(self, d_model: int, learn_pe: bool):
        super().__init__()
        for name, size in CALENDAR_SIZES:
            table = nn.Embedding(size, d_model) if learn_pe else FixedEmbedding(size, d_model)
            setattr(self, f"{name}_embed", table)

    def forward(self, stamp: Tensor) -> Tensor:
        stamp = stamp.long()
        minute = self.minute_embed(stamp[:, :, 0])
        hour = self.hour_embed(stamp[:, :, 1])
        weekday = self.weekday_embed(stamp[:, :, 2])
        day = self.day_embed(stamp[:, :, 3])
        month = self.month_embed(stamp[:, :, 4])
        return hour + weekday + day + month + minute


class DependencyAwareLayer(nn.Module):
    """Cross-attention from the s1 embedding to the hidden states, then norm(h + attn)."""

    def __init__(self, d_model: int, n_heads: int = DEP_LAYER_HEADS, attn_dropout_p: float = 0.0,
                 resid_dropout: float = 0.0):
        super().__init__()
        self.cross_attn = CrossAttention(d_model, n_heads, attn_dropout_p, resid_dropout)
        self.norm = RMSNorm(d_model)

    def forward(self, hidden_states: Tensor, sibling_embed: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        attn_out = self.cross_attn(sibling_embed, hidden_states, hidden_states, key_padding_mask=key_padding_mask)
        return self.norm(hidden_states + attn_out)


class DualHead(nn.Module):
    def __init__(self, s1_bits: int, s2_bits: int, d_model: int):
        super().__init__()
        self.vocab_s1 = 2 ** s1_bits
        self.vocab_s2 = 2 ** s2_bits
        self.proj_s1 = nn.Linear(d_model, self.vocab_s1)
        self.proj_s2 = nn.Linear(d_model, self.vocab_s2)

    def compute_loss(self, s1_logits: Tensor, s2_logits: Tensor, s1_targets: Tensor, s2_targets: Tensor,
                     padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Mean of the s1 and s2 cross-entropies; padded positions (mask 1) are left out."""
        if padding_mask is not None:
            valid = padding_mask == 0
            ce_s1 = F.cross_entropy(s1_logits[valid], s1_targets[valid])
            ce_s2 = F.cross_entropy(s2_logits[valid], s2_targets[valid])
        else:
            ce_s1 = F.cross_entropy(s1_logits.reshape(-1, self.vocab_s1), s1_targets.reshape(-1))
            ce_s2 = F.cross_entropy(s2_logits.reshape(-1, self.vocab_s2), s2_targets.reshape(-1))
        return (ce_s1 + ce_s2) / 2, ce_s1, ce_s2

    def forward(self, x: Tensor) -> Tensor:
        return self.proj_s1(x)

    def cond_forward(self, x2: Tensor) -> Tensor:
        return self.proj_s2(x2)


@dataclass
class KronosCache:
    """Per-layer self-attention caches plus the dependency layer's keys/values."""

    layers: list[LayerCache]
    dep: LayerCache

    @property
    def length(self) -> int:
        return self.dep.length

    def drop_oldest(self, count: int = 1) -> None:
        for cache in (*self.layers, self.dep):
            cache.drop_oldest(count)


class Kronos(nn.Module, PretrainedMixin):
    """The Kronos predictor. Constructor keywords equal the published `config.json` fields."""

    def __init__(self, s1_bits: int, s2_bits: int, n_layers: int, d_model: int, n_heads: int, ff_dim: int,
                 ffn_dropout_p: float, attn_dropout_p: float, resid_dropout_p: float, token_dropout_p: float,
                 learn_te: bool):
        super().__init__()
        self._remember_config({k: v for k, v in locals().items() if k not in ("self", "__class__")})
        self.s1_bits = s1_bits
        self.s2_bits = s2_bits
        self.n_layers = n_layers
        self.d_model = d_model
        self.n_heads = n_heads
        self.s1_vocab_size = 2 ** s1_bits
        self.recompute_every = 0
        self.token_drop = nn.Dropout(token_dropout_p)
        self.embedding = HierarchicalEmbedding(s1_bits, s2_bits, d_model)
        self.time_emb = TemporalEmbedding(d_model, learn_te)
        self.transformer = nn.ModuleList([
            TransformerBlock(d_model, n_heads, ff_dim, ffn_dropout_p, attn_dropout_p, resid_dropout_p)
            for _ in range(n_layers)
        ])
        self.norm = RMSNorm(d_model)
        self.dep_layer = DependencyAwareLayer(d_model)
        self.head = DualHead(s1_bits, s2_bits, d_model)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, FixedEmbedding):
                continue
            if isinstance(module, nn.Linear):
                nn.init.xavier_normal_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding) and module.weight.requires_grad:
                nn.init.normal_(module.weight, mean=0.0, std=self.d_model ** -0.5)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def set_activation_checkpointing(self, every_n: int) -> None:
        """Recompute every n-th Transformer block in backward (0 = off, 1 = all blocks)."""
        self.recompute_every = int(every_n)

    def _embed(self, s1_ids: Tensor, s2_ids: Tensor, stamp: Tensor | None) -> Tensor:
        x = self.embedding([s1_ids, s2_ids])
        if stamp is not None:
            x = x + self.time_emb(stamp)
        return self.token_drop(x)

    def decode_s1(self, s1_ids: Tensor, s2_ids: Tensor, stamp: Tensor | None = None,
                  padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """s1 logits for every position and the normed hidden states (the context for s2)."""
        x = run_blocks(self.transformer, self._embed(s1_ids, s2_ids, stamp), padding_mask, self.recompute_every)
        x = self.norm(x)
        return self.head(x), x

    def decode_s2(self, context: Tensor, s1_ids: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """s2 logits conditioned on the context and s1 ids."""
        x2 = self.dep_layer(context, self.embedding.emb_s1(s1_ids), key_padding_mask=padding_mask)
        return self.head.cond_forward(x2)

    def forward(self, s1_ids: Tensor, s2_ids: Tensor, stamp: Tensor | None = None,
                padding_mask: Tensor | None = None, use_teacher_forcing: bool = False,
                s1_targets: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(s1_logits, s2_logits). s2 is conditioned on `s1_targets` with teacher forcing,
        else on an s1 sampled from the predicted distribution (the reference default)."""
        s1_logits, context = self.decode_s1(s1_ids, s2_ids, stamp, padding_mask)
        if use_teacher_forcing:
            if s1_targets is None:
                raise ValueError("use_teacher_forcing=True needs s1_targets")
            sibling_ids = s1_targets
        else:
            probs = F.softmax(s1_logits.detach().float(), dim=-1)
            sibling_ids = torch.multinomial(probs.view(-1, self.s1_vocab_size), 1).view(s1_ids.shape)
        return s1_logits, self.decode_s2(context, sibling_ids, padding_mask)

    # Prediction with a key/value cache -------------------------------------------------

    def new_cache(self, batch: int, capacity: int, device: torch.device, dtype: torch.dtype) -> KronosCache:
        head_dim = self.d_model // self.n_heads
        layers = [LayerCache(batch, self.n_heads, head_dim, capacity, device, dtype) for _ in self.transformer]
        dep_heads = self.dep_layer.cross_attn.n_heads
        dep = LayerCache(batch, dep_heads, self.d_model // dep_heads, capacity, device, dtype)
        return KronosCache(layers, dep)

    def kv_cache_bytes(self, rows: int, positions: float, element_bytes: int) -> float:
        """Bytes of the cache `new_cache` lays out for `rows` sequences over `positions`:
        keys and values of every Transformer layer plus the dependency layer."""
        return (2 * self.n_layers + 2) * rows * positions * self.d_model * element_bytes

    def extend_cache(self, s1_ids: Tensor, s2_ids: Tensor, stamp: Tensor | None,
                     cache: KronosCache) -> tuple[Tensor, Tensor]:
        """Append tokens [B, T] to the cache; return s1 logits and normed hidden state of the last one.

        Exact with respect to `decode_s1` on the whole window as long as positions
        start at 0 (the window has not slid).
        """
        x = self._embed(s1_ids, s2_ids, stamp)
        for block, layer_cache in zip(self.transformer, cache.layers):
            x = block(x, cache=layer_cache)
        x = self.norm(x)
        keys, values = self.dep_layer.cross_attn.project_keys_values(x)
        cache.dep.append(keys, values)
        last = x[:, -1:]
        return self.head(last)[:, 0], last

    def s2_logits_cached(self, last_hidden: Tensor, s1_ids: Tensor, cache: KronosCache) -> Tensor:
        """s2 logits [B, V2] for the last position given the sampled s1 ids [B]."""
        sibling = self.embedding.emb_s1(s1_ids.view(-1, 1))
        attn = self.dep_layer.cross_attn.attend_cached(sibling, *cache.dep.view())
        return self.head.cond_forward(self.dep_layer.norm(last_hidden + attn))[:, 0]
