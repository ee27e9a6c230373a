"""Transformer building blocks shared by the tokenizer and the predictor.

Parameter names and numerics follow the published Kronos checkpoints
(see docs/architecture.md). Attention layers optionally take a `LayerCache`
so prediction can append one token at a time instead of recomputing the window.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.utils.checkpoint
import torch.nn.functional as F
from torch import Tensor


class RMSNorm(nn.Module):
    """RMS normalization computed in float32, cast back, times a learned weight."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(torch.mean(x32 * x32, dim=-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), dropout after w2."""

    def __init__(self, d_model: int, ff_dim: int, ffn_dropout_p: float = 0.0):
        super().__init__()
        self.w1 = nn.Linear(d_model, ff_dim, bias=False)
        self.w3 = nn.Linear(d_model, ff_dim, bias=False)
        self.w2 = nn.Linear(ff_dim, d_model, bias=False)
        self.ffn_dropout = nn.Dropout(ffn_dropout_p)

    def forward(self, x: Tensor) -> Tensor:
        return self.ffn_dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


def rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding over the head dimension (rotate-half convention).

    `inv_freq` is a persistent buffer because the published state dicts hold it.
    """

    def __init__(self, head_dim: int):
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq)
        self._table_key: tuple | None = None
        self._cos: Tensor | None = None
        self._sin: Tensor | None = None

    def cos_sin(self, length: int, start: int = 0) -> tuple[Tensor, Tensor]:
        """cos/sin tables of shape [1, 1, length, head_dim] for positions start..start+length-1."""
        end = start + length
        # Rebuild when the buffer is replaced (moved, loaded, or a fake tensor in a memory estimate).
        key = (self.inv_freq.device, self.inv_freq.dtype, type(self.inv_freq), id(self.inv_freq))
        if self._table_key != key or self._cos is None or self._cos.shape[2] < end:
            size = max(end, 64 if self._cos is None else 2 * self._cos.shape[2])
            positions = torch.arange(size, device=self.inv_freq.device).type_as(self.inv_freq)
            freqs = torch.outer(positions, self.inv_freq)
            angles = torch.cat((freqs, freqs), dim=-1)
            self._cos = angles.cos()[None, None]
            self._sin = angles.sin()[None, None]
            self._table_key = key
        return self._cos[:, :, start:end], self._sin[:, :, start:end]

    @staticmethod
    def apply(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)


def build_position_tables(module: nn.Module, length: int) -> None:
    """Build the rotary tables of every attention layer under `module` for sequences of `length` now, as its
    first forward on such sequences would (a memory estimate primes a step with them instead of running one)."""
    for sub in module.modules():
        if isinstance(sub, RotaryEmbedding):
            sub.cos_sin(length)


class LayerCache:
    """Keys and values of one attention layer for a batch, preallocated to `capacity` positions.

    Filled front to back. In the approximate sliding mode the oldest position is
    dropped in O(1): the storage becomes a ring, the next token overwrites the
    dropped slot, and `view()` hands attention the slots in storage order. That
    is only valid for a length-1 query, which attends to every cached position
    without a mask, so the order of the keys does not matter.
    """

    def __init__(self, batch: int, n_heads: int, head_dim: int, capacity: int,
                 device: torch.device, dtype: torch.dtype):
        shape = (batch, n_heads, capacity, head_dim)
        # Zeros, not empty: the fixed-shape step attends over every slot behind a mask, and a masked weight of
        # 0 times a NaN/inf left in memory by earlier work is NaN.
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0
        self.start = 0    # storage slot of the oldest position
        self.dropped = 0  # positions dropped from the front (approximate sliding mode)

    @property
    def next_position(self) -> int:
        """RoPE position of the next appended token."""
        return self.length + self.dropped

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values ([B, H, T, hd]) and return all stored so far (see `view`)."""
        count = keys.shape[2]
        if self.length + count > self.capacity:
            raise RuntimeError(f"KV cache overflow: {self.length + count} positions > capacity {self.capacity}")
        slot = (self.start + self.length) % self.capacity
        if slot + count > self.capacity:
            raise RuntimeError("a multi-token append cannot wrap around the ring; append one token at a time")
        self.keys[:, :, slot:slot + count] = keys
        self.values[:, :, slot:slot + count] = values
        self.length += count
        return self.view()

    def view(self) -> tuple[Tensor, Tensor]:
        """Keys and values of the cached positions: in order until the ring wraps, then every slot."""
        if self.length == self.capacity:
            return self.keys, self.values
        if self.start + self.length > self.capacity:
            raise RuntimeError("the cache has a gap: append the next token before attending")
        end = self.start + self.length
        return self.keys[:, :, self.start:end], self.values[:, :, self.start:end]

    def drop_oldest(self, count: int = 1) -> None:
        if count > self.length:
            raise RuntimeError(f"cannot drop {count} positions from a cache holding {self.length}")
        self.start = (self.start + count) % self.capacity
        self.length -= count
        self.dropped += count


def _attention_mask(q_len: int, k_len: int, padding_mask: Tensor | None, device: torch.device) -> Tensor | None:
    """Boolean mask (True = may attend) combining causality and key padding.

    `padding_mask` is [B, k_len] with 1/True marking padded positions. Each query
    may always attend to its own position so fully padded rows stay finite.
    """
    if padding_mask is None:
        return None
    offset = k_len - q_len
    query_pos = torch.arange(q_len, device=device)[:, None] + offset
    key_pos = torch.arange(k_len, device=device)[None, :]
    keep = ~padding_mask.bool()[:, None, None, :]
    return ((key_pos <= query_pos) & keep) | (key_pos == query_pos)


class _ProjectedAttention(nn.Module):
    """q/k/v/out projections (all with bias) and RoPE over the head dimension, as published."""

    def __init__(self, d_model: int, n_heads: int, attn_dropout_p: float = 0.0, resid_dropout_p: float = 0.0):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.rotary = RotaryEmbedding(self.head_dim)
        self.attn_dropout_p = attn_dropout_p
        self.resid_dropout = nn.Dropout(resid_dropout_p)

    def _heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)


class SelfAttention(_ProjectedAttention):
    """Causal multi-head self-attention with RoPE, optionally appending to a LayerCache."""

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, cache: LayerCache | None = None) -> Tensor:
        batch, length, _ = x.shape
        start = cache.next_position if cache is not None else 0
        cos, sin = self.rotary.cos_sin(length, start)
        q = RotaryEmbedding.apply(self._heads(self.q_proj(x)), cos, sin)
        k = RotaryEmbedding.apply(self._heads(self.k_proj(x)), cos, sin)
        v = self._heads(self.v_proj(x))
        if cache is not None:
            k, v = cache.append(k, v)
        k_len = k.shape[2]
        mask = _attention_mask(length, k_len, key_padding_mask, x.device)
        dropout_p = self.attn_dropout_p if self.training else 0.0
        if mask is not None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        elif length == 1:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        elif length == k_len:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        else:
            causal = torch.ones(length, k_len, dtype=torch.bool, device=x.device).tril(k_len - length)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal, dropout_p=dropout_p)
        out = out.transpose(1, 2).contiguous().view(batch, length, self.d_model)
        return self.resid_dropout(self.out_proj(out))

    def forward_tail(self, x: Tensor, count: int) -> Tensor:
        """Outputs of the last `count` positions only: keys and values over all of x, queries for the tail.
        Equal (to rounding) to forward(x)[:, -count:] without a cache or padding."""
        batch, length, _ = x.shape
        cos, sin = self.rotary.cos_sin(length, 0)
        tail = length - count
        q = RotaryEmbedding.apply(self._heads(self.q_proj(x[:, tail:])), cos[:, :, tail:], sin[:, :, tail:])
        k = RotaryEmbedding.apply(self._heads(self.k_proj(x)), cos, sin)
        v = self._heads(self.v_proj(x))
        causal = torch.ones(count, length, dtype=torch.bool, device=x.device).tril(tail)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        out = out.transpose(1, 2).contiguous().view(batch, count, self.d_model)
        return self.out_proj(out)


class CrossAttention(_ProjectedAttention):
    """Cross-attention with RoPE whose table length follows the query (as published).

    Causal whenever query and key have the same length, in training and in eval:
    position t of s2 sees the s1 context of positions <= t only. The published
    layer is causal in training only, so its teacher-forced evaluation lets each
    position see later ones; prediction reads the last position, which sees
    every key either way, so its outputs are identical. With a length-1 query
    both q and k get position 0, i.e. no rotation, which is what makes the
    prediction-time key/value cache exact.
    """

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        batch, q_len, _ = query.shape
        k_len = key.shape[1]
        cos, sin = self.rotary.cos_sin(q_len)
        q = RotaryEmbedding.apply(self._heads(self.q_proj(query)), cos, sin)
        # The published layer applies the query-length table to the keys too; that
        # only broadcasts when the lengths agree or the query has length 1.
        k = RotaryEmbedding.apply(self._heads(self.k_proj(key)), cos, sin)
        v = self._heads(self.v_proj(value))
        dropout_p = self.attn_dropout_p if self.training else 0.0
        causal = q_len == k_len and q_len > 1
        if key_padding_mask is not None:
            if causal:
                mask = _attention_mask(q_len, k_len, key_padding_mask, query.device)
            else:
                mask = ~key_padding_mask.bool()[:, None, None, :]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        else:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
        out = out.transpose(1, 2).contiguous().view(batch, q_len, self.d_model)
        return self.resid_dropout(self.out_proj(out))

    def attend_cached(self, query: Tensor, keys: Tensor, values: Tensor) -> Tensor:
        """Length-1 query against already projected, unrotated keys/values ([B, H, T, hd])."""
        batch = query.shape[0]
        q = self._heads(self.q_proj(query))
        out = F.scaled_dot_product_attention(q, keys, values)
        return self.out_proj(out.transpose(1, 2).reshape(batch, 1, self.d_model))

    def project_keys_values(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        return self._heads(self.k_proj(hidden)), self._heads(self.v_proj(hidden))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then x + ffn(norm2(x))."""

    def __init__(self, d_model: int, n_heads: int, ff_dim: int = 1024, ffn_dropout_p: float = 0.0,
                 attn_dropout_p: float = 0.0, resid_dropout_p: float = 0.0):
        super().__init__()
        self.norm1 = RMSNorm(d_model)
        self.self_attn = SelfAttention(d_model, n_heads, attn_dropout_p, resid_dropout_p)
        self.norm2 = RMSNorm(d_model)
        self.ffn = FeedForward(d_model, ff_dim, ffn_dropout_p)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, cache: LayerCache | None = None) -> Tensor:
        x = x + self.self_attn(self.norm1(x), key_padding_mask=key_padding_mask, cache=cache)
        return x + self.ffn(self.norm2(x))

    def forward_tail(self, x: Tensor, count: int) -> Tensor:
        """The block's output at the last `count` positions (inference, no padding): a last block whose earlier
        positions nobody reads skips their queries, attention and feed-forward."""
        x_tail = x[:, -count:] + self.self_attn.forward_tail(self.norm1(x), count)
        return x_tail + self.ffn(self.norm2(x_tail))


def run_blocks(blocks: nn.ModuleList, x: Tensor, key_padding_mask: Tensor | None = None,
               recompute_every: int = 0) -> Tensor:
    """Run blocks in order; in training, recompute every `recompute_every`-th block in backward (activation
    checkpointing)."""
    for index, block in enumerate(blocks):
        if recompute_every and torch.is_grad_enabled() and index % recompute_every == 0:
            x = torch.utils.checkpoint.checkpoint(block, x, key_padding_mask, use_reentrant=False)
        else:
            x = block(x, key_padding_mask)
    return x
