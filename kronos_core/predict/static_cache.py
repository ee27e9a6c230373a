"""One-token decode steps with fixed shapes, so a step can be captured and replayed as a CUDA graph.

The growing path (`Kronos.extend_cache`) hands attention a view of the filled
cache slots, so every step has new shapes and launches a few hundred small
kernels from Python. `StaticStep` runs the same step over the caches' full
preallocated storage instead:

- attention always reads all `capacity` slots, with a boolean mask of the
  filled ones (slot < filled; once a shifting window is full, every slot);
- the new token's RoPE position, its storage slot and the fill count live in
  one small device tensor, so the kernels' arguments never change;
- inputs are copied into static buffers, outputs come back in static buffers.

Greedy outputs equal the growing path's (the masked slots add exact zeros to
the softmax; tests check token equality across the window slide in both
window modes). On CUDA, `use_graph=True` captures the two halves of a step
(s1 logits, then s2 logits from the sampled s1) as two CUDA graphs after two
warm-up runs on a side stream, as the torch.cuda.CUDAGraph documentation
prescribes, with autocast's weight cache off during capture. Sampling stays
eager between the two graphs, so every sampling rule works unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kronos_core.layers import LayerCache, RotaryEmbedding, SelfAttention
from kronos_core.model import Kronos, KronosCache

DECODE_STEPS = ("dynamic", "static", "graph")


def _attend_step(attn: SelfAttention, x: Tensor, cache: LayerCache, cos: Tensor, sin: Tensor, index: Tensor,
                 valid: Tensor) -> Tensor:
    """SelfAttention.forward for one token, writing its key/value into slot index[1] of the storage."""
    batch = x.shape[0]
    q = RotaryEmbedding.apply(attn._heads(attn.q_proj(x)), cos, sin)
    k = RotaryEmbedding.apply(attn._heads(attn.k_proj(x)), cos, sin)
    v = attn._heads(attn.v_proj(x))
    slot = index[1:2]
    cache.keys.index_copy_(2, slot, k.to(cache.keys.dtype))
    cache.values.index_copy_(2, slot, v.to(cache.values.dtype))
    out = F.scaled_dot_product_attention(q, cache.keys, cache.values, attn_mask=valid)
    return attn.out_proj(out.transpose(1, 2).reshape(batch, 1, attn.d_model))


class StaticStep:
    """Fixed-shape one-token steps over `cache` (see the module doc); one instance per cache."""

    def __init__(self, model: Kronos, cache: KronosCache, stamp_dtype: torch.dtype, max_positions: int,
                 use_graph: bool = False):
        if use_graph and cache.dep.keys.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.model = model
        self.cache = cache
        keys = cache.dep.keys
        batch, device = keys.shape[0], keys.device
        self.capacity = cache.dep.capacity
        self.s1 = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.s2 = torch.zeros_like(self.s1)
        self.stamp = torch.zeros(batch, 1, 5, dtype=stamp_dtype, device=device)
        self.sampled = torch.zeros(batch, dtype=torch.long, device=device)
        self.index = torch.zeros(3, dtype=torch.long, device=device)  # RoPE position, write slot, filled slots
        # One pinned host row per step, never rewritten, so the copies can be non-blocking on CUDA (a copy
        # from pageable memory would wait for the device at every step).
        self._host_index = torch.empty((max_positions, 3), dtype=torch.long, pin_memory=device.type == "cuda")
        self._steps = 0
        self.slots = torch.arange(self.capacity, device=device)
        # Whole RoPE tables, built once: a table rebuilt after capture would leave the graph reading freed memory.
        self.tables = [block.self_attn.rotary.cos_sin(max_positions, 0) for block in model.transformer]
        self.use_graph = use_graph
        self._graphs: tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph] | None = None
        self._outputs: tuple[Tensor, Tensor, Tensor] | None = None  # s1 logits, last hidden, s2 logits

    # The two halves of a step, reading and writing only the static buffers --------------------

    def _run_s1(self) -> tuple[Tensor, Tensor]:
        model, cache = self.model, self.cache
        valid = (self.slots < self.index[2]).view(1, 1, 1, -1)
        position = self.index[0:1]
        x = model._embed(self.s1, self.s2, self.stamp)
        for block, layer_cache, (cos, sin) in zip(model.transformer, cache.layers, self.tables):
            cos_at, sin_at = cos.index_select(2, position), sin.index_select(2, position)
            x = x + _attend_step(block.self_attn, block.norm1(x), layer_cache, cos_at, sin_at, self.index, valid)
            x = x + block.ffn(block.norm2(x))
        x = model.norm(x)
        keys, values = model.dep_layer.cross_attn.project_keys_values(x)
        cache.dep.keys.index_copy_(2, self.index[1:2], keys.to(cache.dep.keys.dtype))
        cache.dep.values.index_copy_(2, self.index[1:2], values.to(cache.dep.values.dtype))
        return model.head(x)[:, 0], x

    def _run_s2(self, last_hidden: Tensor) -> Tensor:
        model, dep = self.model, self.cache.dep
        cross = model.dep_layer.cross_attn
        valid = (self.slots < self.index[2]).view(1, 1, 1, -1)
        sibling = model.embedding.emb_s1(self.sampled.view(-1, 1))
        q = cross._heads(cross.q_proj(sibling))
        out = F.scaled_dot_product_attention(q, dep.keys, dep.values, attn_mask=valid)
        attn = cross.out_proj(out.transpose(1, 2).reshape(sibling.shape[0], 1, cross.d_model))
        return model.head.cond_forward(model.dep_layer.norm(last_hidden + attn))[:, 0]

    # Public ------------------------------------------------------------------------------

    def s1_step(self, s1: Tensor, s2: Tensor, stamp: Tensor) -> tuple[Tensor, Tensor]:
        """Append tokens [B, 1] (with stamps [B, 1, 5]) to the cache; s1 logits [B, V] and the normed hidden
        state [B, 1, d] of the new position (static buffers under a graph: use them before the next step)."""
        cache = self.cache
        if cache.length >= self.capacity:
            raise RuntimeError("static KV cache is full; drop the oldest position first")
        slot = (cache.dep.start + cache.length) % self.capacity
        if self._steps >= len(self._host_index):
            raise RuntimeError(f"more one-token steps than the {len(self._host_index)} this StaticStep was built for")
        host = self._host_index[self._steps]
        host[0], host[1], host[2] = cache.dep.next_position, slot, cache.length + 1
        self._steps += 1
        self.index.copy_(host, non_blocking=True)
        self.s1.copy_(s1)
        self.s2.copy_(s2)
        self.stamp.copy_(stamp)
        if self.use_graph:
            if self._graphs is None:
                self._capture()
            self._graphs[0].replay()
            logits, hidden = self._outputs[0], self._outputs[1]
        else:
            logits, hidden = self._run_s1()
        for layer in (*cache.layers, cache.dep):  # bookkeeping only: the data is already in place
            layer.length += 1
        return logits, hidden

    def s2_logits(self, last_hidden: Tensor, s1_ids: Tensor) -> Tensor:
        """s2 logits [B, V2] of the position just appended, given its sampled s1 ids [B]."""
        self.sampled.copy_(s1_ids)
        if self.use_graph:
            self._graphs[1].replay()
            return self._outputs[2]
        return self._run_s2(last_hidden)

    def _capture(self) -> None:
        autocast_on = torch.is_autocast_enabled("cuda") if _takes_device_type() else torch.is_autocast_enabled()
        dtype = torch.get_autocast_dtype("cuda") if hasattr(torch, "get_autocast_dtype") \
            else torch.get_autocast_gpu_dtype()

        def autocast():
            return torch.autocast("cuda", dtype=dtype, enabled=autocast_on, cache_enabled=False)

        # Warm-up writes go to the slot this step writes anyway, so they leave the cache as it was.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), autocast():
            for _ in range(2):
                _, hidden = self._run_s1()
                self._run_s2(hidden)
        torch.cuda.current_stream().wait_stream(side)
        first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(first), autocast():
            logits, hidden = self._run_s1()
        with torch.cuda.graph(second, pool=first.pool()), autocast():
            s2_logits = self._run_s2(hidden)
        self._graphs = (first, second)
        self._outputs = (logits, hidden, s2_logits)


def _takes_device_type() -> bool:
    try:
        torch.is_autocast_enabled("cuda")
    except TypeError:
        return False
    return True
