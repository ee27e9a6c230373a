"""autobatch's generic core on tiny real models under the simulated (CpuExactMeter) device.

Every test runs real torch steps; "true" maxima are found in the test itself by
bisection with fresh builds under the same cap.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from rich.console import Console
from torch import nn

from kronos_tune.autobatch import ProbeStep, autobatch, split_effective_batch
from kronos_tune.autobatch.probes import toml_snippet
from kronos_tune.commands import autobatch_render as render
from kronos_tune.errors import KronosTuneError
from kronos_tune.memory import CpuExactMeter, OutOfMemoryError

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
SEQ, VOCAB, WIDTH = 16, 64, 32


class TinyAttention(nn.Module):
    """Embedding, one softmax attention, an MLP, a vocabulary head: memory per sample ~ 36 KB."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        x = torch.softmax(x @ x.transpose(1, 2) / WIDTH**0.5, dim=-1) @ x
        return self.head(x + self.down(F.gelu(self.up(x))))


class PairwiseModel(nn.Module):
    """An in-batch pairwise term (like a contrastive loss): memory grows with B^2, a line underestimates it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        return (h[:, None, :] - h[None, :, :]).pow(2).mean()


def _phases(meter: Any):
    return meter.phase if meter is not None else (lambda name: contextlib.nullcontext())


def attention_factory(batch_size: int) -> ProbeStep:
    torch.manual_seed(0)
    model = TinyAttention()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def run(meter: Any = None) -> None:
        phase = _phases(meter)
        with phase("data"):
            idx = torch.randint(0, VOCAB, (batch_size, SEQ))
            target = torch.randint(0, VOCAB, (batch_size, SEQ))
        with phase("forward"):
            loss = F.cross_entropy(model(idx).flatten(0, 1), target.flatten())
        with phase("backward"):
            loss.backward()
        with phase("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return ProbeStep(run, model, optimizer)


def attention_eval_factory(batch_size: int):
    def evaluate() -> None:
        torch.manual_seed(1)
        model = TinyAttention()
        with torch.no_grad():
            model(torch.randint(0, VOCAB, (batch_size, SEQ)))

    return evaluate


def pairwise_factory(batch_size: int) -> ProbeStep:
    torch.manual_seed(0)
    model = PairwiseModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def run() -> None:
        model(torch.randn(batch_size, WIDTH)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return ProbeStep(run, model, optimizer)


def fits(factory, batch_size: int, cap_bytes: int, eval_factory=None) -> bool:
    """Fresh build, two steps (and eval) under a CpuExactMeter of cap_bytes: does it run?"""
    meter = CpuExactMeter(budget_bytes=cap_bytes)
    try:
        with meter:
            step = factory(batch_size)
            step()
            step()
            if eval_factory is not None:
                eval_factory(batch_size)()
        return True
    except OutOfMemoryError:
        return False
    finally:
        step = None
        gc.collect()


def true_max(factory, cap_bytes: int, high: int, eval_factory=None) -> int:
    """Largest batch size that runs under cap_bytes, by bisection with real steps (assumes 1 fits)."""
    lo, hi = 1, high
    assert fits(factory, lo, cap_bytes, eval_factory) and not fits(factory, hi, cap_bytes, eval_factory)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(factory, mid, cap_bytes, eval_factory) else (lo, mid)
    return lo


def peak_of(factory, batch_size: int) -> int:
    meter = CpuExactMeter()
    with meter:
        step = factory(batch_size)
        step()
        step()
    peak = meter.peak_bytes()
    del step
    gc.collect()
    return peak


def test_pick_is_the_true_maximum_within_few_probes_and_frees_everything() -> None:
    budget = 2_000_000
    outer = CpuExactMeter()  # an independent meter around the whole search
    gc.collect()
    with outer:
        before = outer.current_bytes()
        result = autobatch(attention_factory, budget, margin=0.1, eval_factory=attention_eval_factory)
        gc.collect()
        after = outer.current_bytes()
    assert after == before and result.leftover_bytes == 0

    usable = int(budget * 0.9)
    best = true_max(attention_factory, usable, 256, attention_eval_factory)
    assert 0.9 * best <= result.batch_size <= best
    assert result.search_probes <= 6
    assert result.accumulation_steps == 1
    assert result.measured_peak_bytes <= result.usable_bytes == usable
    assert result.headroom_bytes == budget - result.measured_peak_bytes
    assert result.probes[0].batch_size == 1 and all(p.status != "oom" for p in result.probes)
    verified = [p for p in result.probes if p.status == "verify"]
    assert len(verified) == 1 and verified[0].batch_size == result.batch_size
    assert verified[0].peak_bytes == result.measured_peak_bytes
    assert result.predicted_peak_bytes >= result.measured_peak_bytes  # never below a measured point
    assert result.bytes_per_sample > 0 and 0 < result.fixed_bytes < result.measured_peak_bytes
    assert set(result.fit_lines) >= {"total", "forward", "optimizer"}  # per-phase lines from meter.phase()

    console = Console(record=True, width=100)
    console.print(render.summary_table(result, "t"), render.probes_table(result), render.memory_plot(result))
    text = console.export_text()
    assert "◆" in text and "▲" in text and f"pick {result.batch_size}" in text
    assert toml_snippet(result.batch_size, 1) == f"batch_size = {result.batch_size}\naccumulation_steps = 1\n"


def test_failed_verification_backs_off_to_a_size_that_fits() -> None:
    # Peaks at 1 and 8 give a line; the B^2 term makes 16 need more than the line says.
    # Put the usable budget between the line's prediction at 16 and the real peak there.
    p1, p8, p16 = (peak_of(pairwise_factory, b) for b in (1, 8, 16))
    line_at_16 = p8 + (p8 - p1) / 7 * 8
    assert p16 > line_at_16 * 1.2
    margin = 0.1
    usable = int((line_at_16 + p16) / 2)
    budget = int(usable / (1 - margin)) + 1

    result = autobatch(pairwise_factory, budget, margin=margin, max_probes=2)
    verify_runs = [p for p in result.probes if p.kind == "verify"]
    assert verify_runs[0].batch_size == 16 and verify_runs[0].status == "oom"  # the fitted pick failed
    assert verify_runs[-1].status == "verify" and verify_runs[-1].batch_size == result.batch_size
    assert result.batch_size < 16 and result.measured_peak_bytes <= result.usable_bytes
    assert result.search_probes == 2 and any("backed off" in note for note in result.notes)
    assert 0.7 * true_max(pairwise_factory, result.usable_bytes, 16) <= result.batch_size
    assert result.batch_size <= true_max(pairwise_factory, result.usable_bytes, 16)
    assert result.leftover_bytes == 0


def test_accumulation_keeps_the_effective_batch() -> None:
    result = autobatch(attention_factory, 2_000_000, effective_batch=100)
    assert result.batch_size * result.accumulation_steps == 100
    assert result.accumulation_steps >= 2 and result.batch_size <= result.max_fit_batch_size
    assert all(p.batch_size <= 100 for p in result.probes)
    assert any("effective batch 100 exactly" in note for note in result.notes)

    small = autobatch(attention_factory, 2_000_000, effective_batch=12)  # fits: never above the effective batch
    assert (small.batch_size, small.accumulation_steps) == (12, 1)
    assert max(p.batch_size for p in small.probes) == 12

    assert split_effective_batch(45, 100)[:2] == (25, 4)
    assert split_effective_batch(200, 100)[:2] == (100, 1)
    batch, steps, how = split_effective_batch(33, 97)  # prime: no exact split with few micro-steps
    assert (batch, steps) == (33, 3) and "99" in how


def test_budget_below_the_fixed_cost_is_one_line_with_the_cost() -> None:
    with pytest.raises(KronosTuneError) as info:
        autobatch(attention_factory, 100_000)
    message = str(info.value)
    assert "\n" not in message and "fixed cost" in message and "smaller model_size" in message
    fixed = peak_of(attention_factory, 1) - (peak_of(attention_factory, 2) - peak_of(attention_factory, 1))
    assert f"{fixed / 1024:.2f} KiB before any sample" in message


def test_estimate_mode_equals_real_mode_on_cpu() -> None:
    real = autobatch(attention_factory, 3_000_000, eval_factory=attention_eval_factory)
    fake = autobatch(attention_factory, 3_000_000, eval_factory=attention_eval_factory, estimate=True)
    assert fake.estimate and not real.estimate
    assert fake.batch_size == real.batch_size
    assert [(p.batch_size, p.peak_bytes, p.status) for p in fake.probes] == \
        [(p.batch_size, p.peak_bytes, p.status) for p in real.probes]


def test_bad_arguments_are_user_errors() -> None:
    for kwargs in ({"margin": 1.0}, {"margin": -0.1}, {"min_batch": 0}, {"max_probes": 1}):
        with pytest.raises(KronosTuneError):
            autobatch(attention_factory, 2_000_000, **kwargs)
    with pytest.raises(KronosTuneError, match="model and .optimizer|.model and"):
        autobatch(lambda b: (lambda: None), 2_000_000, estimate=True)


@pytest.mark.gpu
@needs_cuda
def test_cuda_search_frees_memory_and_uncaps() -> None:
    def factory(batch_size: int) -> ProbeStep:
        model = TinyAttention().cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def run() -> None:
            idx = torch.randint(0, VOCAB, (batch_size, SEQ), device="cuda")
            F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return ProbeStep(run, model, optimizer)

    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    # The budget is sized from this card's own fixed cost of a step (weights, optimizer state, cuBLAS
    # workspace: 65 MiB on an H200, more than a fixed 64 MiB budget), so the search always has room.
    torch.cuda.reset_peak_memory_stats()
    probe = factory(1)
    probe.run()
    probe.run()
    fixed = torch.cuda.max_memory_allocated() - before
    del probe
    gc.collect()
    torch.cuda.empty_cache()
    budget = 2 * fixed + (32 << 20)
    result = autobatch(factory, budget, device="cuda")
    gc.collect()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() == before and result.leftover_bytes == 0
    assert result.batch_size >= 1 and result.measured_peak_bytes <= result.usable_bytes
    big = torch.empty(budget + (32 << 20), dtype=torch.uint8, device="cuda")  # above the cap: it was lifted
    del big


def test_default_margin_follows_what_the_meter_cannot_see() -> None:
    from kronos_tune.memory.peak import default_margin
    from kronos_tune.memory import CudaEmulation

    assert default_margin("cpu") == 0.05  # exact CPU meter: only kernel scratch is unseen
    assert default_margin("cuda") == 0.10  # allocator fragmentation and workspaces
    assert default_margin(None, estimate=True, cuda_emulation=CudaEmulation()) == 0.10
    assert default_margin(None, estimate=True) == 0.05
