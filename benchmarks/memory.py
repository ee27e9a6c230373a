"""Compare the exact CPU meter with the fake estimate on a tiny transformer.

    python -m benchmarks.memory [--batches 8 32 64] [--repeats 3]

For each mode (fp32, bf16 autocast, activation checkpointing) and batch size it
prints the real ``CpuExactMeter`` peak of a warm training step, the
``FakeEstimate`` peak, their difference and the wall time of one estimate
(median/min/max over repeats); then the tracker's overhead on step time.
``compare()`` takes any build/step pair, so a bigger model can be plugged in.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ContextManager

import torch
import torch.nn.functional as F
from torch import nn
from kronos_tune.torch_private import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

from kronos_tune.memory.estimate import BuildFn, StepFn, estimate_step_peak
from kronos_tune.memory.meters import CpuExactMeter

_MIB = float(1 << 20)


class _Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.ff(self.ln2(x))


class TinyTransformer(nn.Module):
    """Decoder-only toy model (token + position embedding, pre-LN blocks, LM head)."""

    def __init__(
        self, vocab: int = 128, d_model: int = 64, n_heads: int = 4, n_layers: int = 2, seq_len: int = 32,
        checkpointing: bool = False,
    ) -> None:
        super().__init__()
        self.vocab, self.seq_len, self.checkpointing = vocab, seq_len, checkpointing
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(seq_len, d_model))
        self.blocks = nn.ModuleList(_Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx) + self.pos
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        return self.head(self.ln_f(x))


def make_build(checkpointing: bool = False, **model_kwargs: Any) -> BuildFn:
    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = TinyTransformer(checkpointing=checkpointing, **model_kwargs)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    return build


def _no_phase(name: str) -> ContextManager[None]:
    return contextlib.nullcontext()


def make_step(autocast_bf16: bool = False) -> StepFn:
    """A full training step; uses ``meter.phase`` when a meter is given."""

    def step(model: nn.Module, optimizer: torch.optim.Optimizer, batch_size: int, meter: Any = None) -> None:
        phase = meter.phase if meter is not None else _no_phase
        with phase("data"):
            idx = torch.randint(0, model.vocab, (batch_size, model.seq_len))
            target = torch.randint(0, model.vocab, (batch_size, model.seq_len))
        with phase("forward"):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_bf16):
                logits = model(idx)
            loss = F.cross_entropy(logits.float().view(-1, model.vocab), target.view(-1))
        with phase("backward"):
            loss.backward()
        with phase("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


MODES: dict[str, tuple[bool, bool]] = {  # name -> (checkpointing, bf16 autocast)
    "fp32": (False, False),
    "bf16-autocast": (False, True),
    "checkpointing": (True, False),
}


def measure_real_peak(build: BuildFn, step: StepFn, batch_size: int, steps: int = 2) -> tuple[int, dict[str, int]]:
    """CpuExactMeter peak of the last of ``steps`` real steps (model built under tracking)."""
    meter = CpuExactMeter()
    with meter:
        model, optimizer = build()
        for i in range(steps):
            if i == steps - 1:
                meter.reset()
            step(model, optimizer, batch_size, meter=meter)
        result = meter.peak_bytes(), meter.peaks()
        del model, optimizer
    return result


@dataclass
class CompareRow:
    mode: str
    batch_size: int
    real_peak_bytes: int
    fake_peak_bytes: int
    estimate_s: list[float]

    @property
    def diff_pct(self) -> float:
        return 100.0 * (self.fake_peak_bytes - self.real_peak_bytes) / self.real_peak_bytes


def compare(mode: str, build: BuildFn, step: StepFn, batch_sizes: list[int], repeats: int) -> Iterator[CompareRow]:
    for batch_size in batch_sizes:
        real_peak, _ = measure_real_peak(build, step, batch_size)
        times: list[float] = []
        fake_peak = 0
        for _ in range(repeats):
            start = time.perf_counter()
            fake_peak = estimate_step_peak(build, step, batch_size).allocated_peak_bytes
            times.append(time.perf_counter() - start)
        yield CompareRow(mode, batch_size, real_peak, fake_peak, times)


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        return func(*args, **(kwargs or {}))


def tracker_overhead(build: BuildFn, step: StepFn, batch_size: int, repeats: int) -> tuple[float, float, int]:
    """Median step seconds without and with a CpuExactMeter (interleaved repeats), and ATen ops per step."""
    model, optimizer = build()
    step(model, optimizer, batch_size)  # warm up (optimizer state, allocator)
    with _OpCounter() as counter:
        step(model, optimizer, batch_size)
    meter = CpuExactMeter()
    meter.track_existing(model, optimizer)
    plain: list[float] = []
    metered: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        step(model, optimizer, batch_size)
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        with meter:
            step(model, optimizer, batch_size, meter=meter)
        metered.append(time.perf_counter() - start)
    return statistics.median(plain), statistics.median(metered), counter.ops


def _fmt_row(row: CompareRow) -> str:
    t = row.estimate_s
    return (
        f"{row.mode:<14} {row.batch_size:>5} {row.real_peak_bytes / _MIB:>11.3f} {row.fake_peak_bytes / _MIB:>11.3f} "
        f"{row.diff_pct:>+7.3f}% {statistics.median(t) * 1e3:>8.1f} {min(t) * 1e3:>8.1f} {max(t) * 1e3:>8.1f}"
    )


def main(argv: list[str] | None = None, out: Callable[[str], None] = print) -> list[CompareRow]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--overhead-repeats", type=int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    out(f"torch {torch.__version__}, threads {torch.get_num_threads()}, model {TinyTransformer()._get_name()} "
        f"({sum(p.numel() for p in TinyTransformer().parameters())} params), AdamW, warm step 2 measured")
    out(f"{'mode':<14} {'batch':>5} {'real MiB':>11} {'fake MiB':>11} {'diff':>8} "
        f"{'est med ms':>8} {'min ms':>8} {'max ms':>8}")
    rows: list[CompareRow] = []
    for mode, (ckpt, bf16) in MODES.items():
        for row in compare(mode, make_build(ckpt), make_step(bf16), args.batches, args.repeats):
            rows.append(row)
            out(_fmt_row(row))
    batch = args.batches[len(args.batches) // 2]
    plain_s, metered_s, ops = tracker_overhead(make_build(), make_step(), batch, args.overhead_repeats)
    out(f"tracker overhead (fp32, batch {batch}, median of {args.overhead_repeats} interleaved): "
        f"{plain_s * 1e3:.2f} ms plain, {metered_s * 1e3:.2f} ms with CpuExactMeter "
        f"({100 * (metered_s / plain_s - 1):+.1f}%), {ops} ATen ops/step = "
        f"{(metered_s - plain_s) / ops * 1e6:.1f} us per op")
    return rows


if __name__ == "__main__":
    main()
