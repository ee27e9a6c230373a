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

`generate_tokens` picks its stepper once (`RecomputeStepper`, `CachedStepper`,
or `StaticStepper` for the fixed-shape and CUDA-graph steps), and a
`DecodeWindow` says at each step which tokens to feed and whether the cache is
re-filled or its oldest position dropped; the loop itself only windows, steps,
samples, writes and reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from kronos_core.model import Kronos, KronosCache
from kronos_core.predict.static_cache import DECODE_STEPS, StaticStep
from kronos_core.predict.streams import RowStreams, sample_inverse_cdf

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


def sample_tokens(logits: Tensor, params: SamplingParams, generator: torch.Generator | None = None,
                  streams: RowStreams | None = None) -> Tensor:
    """Sample one token id per row of `logits` [B, V] -> [B]: from each row's own stream (streams.py) when
    `streams` is given, else from `generator` (None: torch's global one). Greedy draws nothing."""
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
    if streams is not None:
        return sample_inverse_cdf(probs, streams.uniforms())
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@dataclass(frozen=True)
class WindowStep:
    """One step of a DecodeWindow."""

    tokens: slice  # what the step feeds the model: the window on a refill, else the newest token
    end: int  # where the sampled token goes
    refill: bool  # (re-)fill a new cache from `tokens`
    drop_oldest: bool  # the cache is full: drop its oldest position before appending
    capacity: int  # positions of the cache a refill makes
    appends: int  # on a refill: one-token steps that follow before the next refill


class DecodeWindow:
    """Which tokens each step feeds the model, and what happens to the cache (the module doc's rules).

    Step `step` writes token `end = history + step` and sees the window [start, end), start =
    max(0, end - max_context). `mode` "recompute" feeds the whole window at every step. With a cache
    ("refill", "shift") the first step fills it from the window; a later step feeds only the newest token,
    except in "refill" mode once the window has slid: then the cache is re-filled from the new window at
    each step (positions restart at 0). In "shift" mode the oldest cached position is dropped first once
    the cache is full, and positions keep increasing.
    """

    def __init__(self, history: int, pred_len: int, max_context: int, mode: str) -> None:
        self.history, self.pred_len, self.max_context, self.mode = history, pred_len, max_context, mode
        self._cache_start = -1  # absolute index of the first token held in the cache
        self._capacity = 0

    def at(self, step: int) -> WindowStep:
        end = self.history + step
        start = max(0, end - self.max_context)
        if self._cache_start < 0 or self.mode == "recompute" or (self.mode == "refill" and start != self._cache_start):
            self._cache_start = start
            self._capacity = min(self.max_context, self.history + self.pred_len) if start == 0 else self.max_context
            return WindowStep(slice(start, end), end, True, False, self._capacity, self._appends_after(step, start))
        drop = end - 1 - self._cache_start == self._capacity  # the cache holds tokens [cache_start, end - 1)
        self._cache_start += drop
        return WindowStep(slice(end - 1, end), end, False, drop, self._capacity, 0)

    def _appends_after(self, step: int, start: int) -> int:
        """One-token steps after a refill at `step` before the next refill."""
        if self.mode == "shift":
            return self.pred_len - 1 - step
        if self.mode == "recompute" or start > 0:  # after the slide, refill mode refills at every step
            return 0
        return max(0, min(self.pred_len - 1, self.max_context - self.history) - step)  # until the window slides


class RecomputeStepper:
    """The reference: the whole window through decode_s1 / decode_s2 at every step."""

    def __init__(self, model: Kronos) -> None:
        self.model = model
        self._context: Tensor | None = None

    def step(self, s1: Tensor, s2: Tensor, stamp: Tensor, at: WindowStep) -> Tensor:
        """s1 logits [B, V] of the next position."""
        s1_logits, self._context = self.model.decode_s1(s1, s2, stamp)
        return s1_logits[:, -1]

    def s2_logits(self, s1_ids: Tensor) -> Tensor:
        """s2 logits [B, V2] of the position `step` just predicted, given its sampled s1 ids [B]."""
        return self.model.decode_s2(self._context, s1_ids.unsqueeze(-1))[:, -1]


class CachedStepper:
    """Key/value cache; every step appends to it through `Kronos.extend_cache` (a view of the filled slots)."""

    def __init__(self, model: Kronos, batch: int, device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.batch, self.device, self.dtype = model, batch, device, dtype
        self.cache: KronosCache | None = None
        self._s2_logits: Callable[[Tensor], Tensor] | None = None

    def step(self, s1: Tensor, s2: Tensor, stamp: Tensor, at: WindowStep) -> Tensor:
        if at.refill:
            self.cache = self.model.new_cache(self.batch, at.capacity, self.device, self.dtype)
            self._refilled(at)
            return self._extend(s1, s2, stamp)
        if at.drop_oldest:
            self.cache.drop_oldest()
        return self._append_one(s1, s2, stamp)

    def s2_logits(self, s1_ids: Tensor) -> Tensor:
        return self._s2_logits(s1_ids)

    def _refilled(self, at: WindowStep) -> None:
        pass

    def _append_one(self, s1: Tensor, s2: Tensor, stamp: Tensor) -> Tensor:
        return self._extend(s1, s2, stamp)

    def _extend(self, s1: Tensor, s2: Tensor, stamp: Tensor) -> Tensor:
        s1_logits, last_hidden = self.model.extend_cache(s1, s2, stamp, self.cache)
        self._s2_logits = partial(self.model.s2_logits_cached, last_hidden, cache=self.cache)
        return s1_logits


class StaticStepper(CachedStepper):
    """Fills the cache as CachedStepper does; one-token steps run with fixed shapes (static_cache.StaticStep),
    eagerly or, with `graphs`, as CUDA graphs when at least GRAPH_MIN_STEPS of them follow the fill."""

    def __init__(self, model: Kronos, batch: int, device: torch.device, dtype: torch.dtype,
                 stamp_dtype: torch.dtype, max_positions: int, graphs: bool) -> None:
        super().__init__(model, batch, device, dtype)
        self.stamp_dtype, self.max_positions, self.graphs = stamp_dtype, max_positions, graphs
        self._static: StaticStep | None = None
        self._appends = 0

    def _refilled(self, at: WindowStep) -> None:
        self._static, self._appends = None, at.appends

    def _append_one(self, s1: Tensor, s2: Tensor, stamp: Tensor) -> Tensor:
        if self._static is None:
            self._static = StaticStep(self.model, self.cache, self.stamp_dtype, self.max_positions,
                                      use_graph=self.graphs and self._appends >= GRAPH_MIN_STEPS)
        s1_logits, hidden = self._static.s1_step(s1, s2, stamp)
        self._s2_logits = partial(self._static.s2_logits, hidden)
        return s1_logits


def generate_tokens(model: Kronos, s1: Tensor, s2: Tensor, stamps: Tensor, pred_len: int, max_context: int,
                    params: SamplingParams, use_cache: bool = True, window_mode: str = "refill",
                    cache_dtype: torch.dtype | None = None, generator: torch.Generator | None = None,
                    on_step: Callable[[int], None] | None = None,
                    decode_step: str = "dynamic", streams: RowStreams | None = None) -> tuple[Tensor, Tensor]:
    """Generate `pred_len` token pairs after the history tokens s1, s2 [B, L].

    `stamps` [B, L + pred_len, 5] holds the calendar features of history and
    future. Returns (s1, s2) of the generated tokens, each [B, pred_len].
    `decode_step` runs the cached one-token steps over a view of the filled
    cache ("dynamic"), over the whole preallocated cache with a mask ("static",
    fixed shapes), or as CUDA graphs of those fixed-shape steps ("graph",
    CUDA only; eager "static" when fewer than GRAPH_MIN_STEPS one-token steps
    follow a prefill, since capturing costs a few steps). With `streams`, every
    row samples from its own stream (streams.py) instead of `generator`.
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
    window = DecodeWindow(history, pred_len, max_context, window_mode if use_cache else "recompute")
    stepper = _stepper(model, use_cache, decode_step, batch, s1.device, cache_dtype, stamps.dtype,
                       history + pred_len + 1)

    for step in range(pred_len):
        at = window.at(step)
        s1_logits = stepper.step(tokens_s1[:, at.tokens], tokens_s2[:, at.tokens], stamps[:, at.tokens], at)
        next_s1 = sample_tokens(s1_logits, params, generator, streams)
        next_s2 = sample_tokens(stepper.s2_logits(next_s1), params, generator, streams)
        tokens_s1[:, at.end] = next_s1
        tokens_s2[:, at.end] = next_s2
        if on_step is not None:
            on_step(step)
    return tokens_s1[:, history:], tokens_s2[:, history:]


def _stepper(model: Kronos, use_cache: bool, decode_step: str, batch: int, device: torch.device,
             cache_dtype: torch.dtype | None, stamp_dtype: torch.dtype,
             max_positions: int) -> RecomputeStepper | CachedStepper:
    if not use_cache:
        return RecomputeStepper(model)
    dtype = cache_dtype or next(model.parameters()).dtype
    if decode_step == "dynamic":
        return CachedStepper(model, batch, device, dtype)
    return StaticStepper(model, batch, device, dtype, stamp_dtype, max_positions, graphs=decode_step == "graph")
