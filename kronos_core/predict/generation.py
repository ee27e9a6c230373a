"""Autoregressive token generation for Kronos, with and without a key/value cache.

Both paths consume the same window as the published implementation: at most
`max_context` tokens, and once history plus generated tokens exceed it, the
last `max_context` tokens with positions restarting at 0.

- `use_cache=False`: recompute the whole window at every step (the reference method).
- `use_cache=True`, `window_mode="refill"` (default): exact. Append one token per
  step to the cache while the window has not slid; after it slides, re-fill a
  fresh cache from the new window at each step (same cost as recomputing).
- `use_cache=True`, `window_mode="shift"`: approximate and fast after sliding.
  The oldest cached position is dropped (in O(1), the cache becomes a ring) and
  new tokens keep rotating at increasing positions. RoPE scores depend only on relative distance, so the
  only approximation is that cached states still carry the influence of the
  tokens that left the window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from kronos_core.model import Kronos, KronosCache
from kronos_core.predict.static_cache import DECODE_STEPS, StaticStep

WINDOW_MODES = ("refill", "shift")
GRAPH_MIN_STEPS = 8


@dataclass(frozen=True)
class SamplingParams:
    """Temperature, then top-k (if k > 0) else nucleus top-p (if p < 1). top_k=1 is greedy."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.9

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature T must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def sample_tokens(logits: Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> Tensor:
    """Sample one token id per row of `logits` [B, V] -> [B]."""
    if params.top_k == 1:
        return logits.argmax(dim=-1)
    logits = logits.float() / params.temperature
    if params.top_k > 0:
        k = min(params.top_k, logits.shape[-1])
        threshold = torch.topk(logits, k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < threshold, float("-inf"))
    elif params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
        remove = cumulative > params.top_p
        # Keep the first token past the threshold too, so the kept mass reaches top_p.
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = False
        logits = logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _recompute_step(model: Kronos, s1: Tensor, s2: Tensor, stamp: Tensor, params: SamplingParams,
                    generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """One step the reference way: the whole window through decode_s1 / decode_s2."""
    s1_logits, context = model.decode_s1(s1, s2, stamp)
    next_s1 = sample_tokens(s1_logits[:, -1], params, generator)
    s2_logits = model.decode_s2(context, next_s1.unsqueeze(-1))
    next_s2 = sample_tokens(s2_logits[:, -1], params, generator)
    return next_s1, next_s2


def _cached_step(model: Kronos, cache: KronosCache, s1: Tensor, s2: Tensor, stamp: Tensor,
                 params: SamplingParams, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Append tokens [B, T] to the cache and sample the next (s1, s2)."""
    s1_logits, last_hidden = model.extend_cache(s1, s2, stamp, cache)
    next_s1 = sample_tokens(s1_logits, params, generator)
    next_s2 = sample_tokens(model.s2_logits_cached(last_hidden, next_s1, cache), params, generator)
    return next_s1, next_s2


def _one_token_steps(step: int, pred_len: int, history: int, max_context: int, cache_start: int,
                     window_mode: str) -> int:
    """One-token steps from `step` on before the cache is re-filled (refill mode re-fills once the window slides)."""
    if window_mode == "shift":
        return pred_len - step
    return sum(1 for later in range(step, pred_len) if max(0, history + later - max_context) == cache_start)


def generate_tokens(model: Kronos, s1: Tensor, s2: Tensor, stamps: Tensor, pred_len: int, max_context: int,
                    params: SamplingParams, use_cache: bool = True, window_mode: str = "refill",
                    cache_dtype: torch.dtype | None = None, generator: torch.Generator | None = None,
                    on_step: Callable[[int], None] | None = None,
                    decode_step: str = "dynamic") -> tuple[Tensor, Tensor]:
    """Generate `pred_len` token pairs after the history tokens s1, s2 [B, L].

    `stamps` [B, L + pred_len, 5] holds the calendar features of history and
    future. Returns (s1, s2) of the generated tokens, each [B, pred_len].
    `decode_step` runs the cached one-token steps over a view of the filled
    cache ("dynamic"), over the whole preallocated cache with a mask ("static",
    fixed shapes), or as CUDA graphs of those fixed-shape steps ("graph",
    CUDA only; eager "static" when fewer than GRAPH_MIN_STEPS one-token steps
    follow a prefill, since capturing costs a few steps).
    """
    if window_mode not in WINDOW_MODES:
        raise ValueError(f"window_mode must be one of {WINDOW_MODES}, got {window_mode!r}")
    if decode_step not in DECODE_STEPS:
        raise ValueError(f"decode_step must be one of {DECODE_STEPS}, got {decode_step!r}")
    batch, history = s1.shape
    tokens_s1 = torch.empty(batch, history + pred_len, dtype=s1.dtype, device=s1.device)
    tokens_s2 = torch.empty_like(tokens_s1)
    tokens_s1[:, :history] = s1
    tokens_s2[:, :history] = s2
    cache: KronosCache | None = None
    static: StaticStep | None = None
    cache_start = -1  # absolute index of the first token held in the cache
    dtype = cache_dtype or next(model.parameters()).dtype

    for step in range(pred_len):
        end = history + step
        start = max(0, end - max_context)
        if not use_cache:
            next_s1, next_s2 = _recompute_step(model, tokens_s1[:, start:end], tokens_s2[:, start:end],
                                               stamps[:, start:end], params, generator)
        else:
            fresh = cache is None or (start != cache_start and window_mode == "refill")
            if fresh:
                capacity = min(max_context, history + pred_len) if start == 0 else max_context
                cache = model.new_cache(batch, capacity, s1.device, dtype)
                cache_start, begin, static = start, start, None
            else:
                begin = end - 1
                if cache.length == cache.dep.capacity:
                    cache.drop_oldest()
                    cache_start += 1
            if fresh or decode_step == "dynamic":
                next_s1, next_s2 = _cached_step(model, cache, tokens_s1[:, begin:end], tokens_s2[:, begin:end],
                                                stamps[:, begin:end], params, generator)
            else:
                if static is None:
                    following = _one_token_steps(step, pred_len, history, max_context, cache_start, window_mode)
                    static = StaticStep(model, cache, stamps.dtype, history + pred_len + 1,
                                        use_graph=decode_step == "graph" and following >= GRAPH_MIN_STEPS)
                logits, hidden = static.s1_step(tokens_s1[:, begin:end], tokens_s2[:, begin:end],
                                                stamps[:, begin:end])
                next_s1 = sample_tokens(logits, params, generator)
                next_s2 = sample_tokens(static.s2_logits(hidden, next_s1), params, generator)
        tokens_s1[:, end] = next_s1
        tokens_s2[:, end] = next_s2
        if on_step is not None:
            on_step(step)
    return tokens_s1[:, history:], tokens_s2[:, history:]
