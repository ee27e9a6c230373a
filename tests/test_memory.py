"""Tests for kronos_tune.memory: exact meters, fake estimates, simulated devices."""

from __future__ import annotations

import gc
import resource

import psutil
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kronos_core.errors import KronosError
from kronos_tune.errors import KronosTuneError
from kronos_tune.memory import (
    CpuExactMeter,
    CudaEmulation,
    CudaMeter,
    MemoryBudget,
    LiveMeter,
    StorageTracker,
    apply_cuda_budget,
    estimate_step_peak,
    make_meter,
)
from benchmarks.memory import make_build, make_step, measure_real_peak

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
MIB = 1 << 20
# A small transformer keeps every fake-vs-real comparison well under a second.
TINY = dict(vocab=32, d_model=32, n_heads=4, n_layers=2, seq_len=16)


def mlp_build(foreach: bool | None = None, fused: bool | None = None):
    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16), nn.LayerNorm(16), nn.Linear(16, 4))
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=foreach, fused=fused)

    return build


def mlp_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch_size: int, meter=None) -> None:
    from contextlib import nullcontext

    phase = meter.phase if meter is not None else (lambda name: nullcontext())
    with phase("data"):
        x = torch.randn(batch_size, 16)
        y = torch.randint(0, 4, (batch_size,))
    with phase("forward"):
        loss = F.cross_entropy(model(x), y)
    with phase("backward"):
        loss.backward()
    with phase("optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


# ---------------------------------------------------------------- exactness
def test_hand_computed_current_and_peak() -> None:
    meter = CpuExactMeter()
    with meter:
        a = torch.empty(1000)  # 4000 B
        b = torch.empty(10, dtype=torch.float64)  # 80 B
        assert meter.current_bytes() == 4080
        del a
        assert meter.current_bytes() == 80
        c = torch.empty(250, dtype=torch.int16)  # 500 B
        assert meter.current_bytes() == 580
    assert meter.peak_bytes() == 4080
    del b, c
    assert meter.current_bytes() == 0  # frees are seen after the mode exits too
    assert meter.peak_bytes() == 4080
    meter.reset()
    assert meter.peak_bytes() == 0


def test_views_and_inplace_are_not_counted_twice() -> None:
    meter = CpuExactMeter()
    with meter:
        a = torch.zeros(64, 64)  # 16384 B
        views = [a[1:], a.t(), a.view(-1), a[:, 3], a.unsqueeze(0).expand(3, 64, 64)]
        a.add_(1).mul_(2)
        a[0].fill_(3)
        assert meter.current_bytes() == 16384
        del a  # views keep the storage alive
        assert meter.current_bytes() == 16384
        views.clear()
        assert meter.current_bytes() == 0
        b = torch.zeros(4, 4).contiguous().reshape(16)  # no copy
        assert meter.current_bytes() == 64
        c = torch.zeros(4, 4).t().contiguous()  # copy: 2 storages alive briefly, 1 kept
        assert meter.current_bytes() == 128
    assert meter.peak_bytes() == 16384
    del b, c


def test_out_variant_resize_is_counted() -> None:
    meter = CpuExactMeter()
    with meter:
        out = torch.empty(0)
        torch.add(torch.ones(100), 1, out=out)
        assert meter.current_bytes() == 400  # `out` grew to 100 floats
    del out
    assert meter.current_bytes() == 0


def test_track_existing_counts_params_grads_and_optimizer_state() -> None:
    model, optimizer = mlp_build()()
    mlp_step(model, optimizer, 8)
    loss = model(torch.randn(2, 16)).sum()
    loss.backward()  # grads alive
    param_bytes = sum(p.numel() * 4 for p in model.parameters())
    state_bytes = sum(t.untyped_storage().nbytes() for s in optimizer.state.values() for t in s.values())
    meter = CpuExactMeter()
    added = meter.track_existing(model, optimizer, [model.parameters()])
    assert added == 2 * param_bytes + state_bytes  # params + grads + exp_avg/exp_avg_sq/step
    assert meter.track_existing(model) == 0  # already known


def test_peak_per_phase_hand_computed() -> None:
    meter = CpuExactMeter()
    with meter:
        base = torch.empty(100)  # 400 B live throughout
        with meter.phase("forward"):
            tmp = torch.empty(1000)  # 4000 B
            del tmp
            keep = torch.empty(50)  # 200 B
        with meter.phase("backward"):
            with meter.phase("inner"):
                tmp = torch.empty(500)  # 2000 B
                del tmp
            tmp = torch.empty(250)  # 1000 B
            del tmp
        with meter.phase("forward"):  # repeat: the max over repeats is kept
            tmp = torch.empty(10)
            del tmp
    assert meter.peaks() == {"forward": 4400, "inner": 2600, "backward": 2600}
    assert meter.peak_bytes() == 4400
    meter.reset()
    assert meter.peaks() == {} and meter.peak_bytes() == 600
    del base, keep


def test_phase_enters_tracking_when_not_active() -> None:
    meter = CpuExactMeter()
    assert isinstance(meter, LiveMeter)
    with meter.phase("forward"):
        x = torch.empty(256)
    y = torch.empty(1000)  # after the phase the mode is off again: not seen
    assert meter.peaks() == {"forward": 1024} and meter.current_bytes() == 1024
    del x, y


def test_a_fed_tracker_counts_what_it_is_handed_and_its_phases_enter_no_mode() -> None:
    tracker = StorageTracker()
    with tracker.fed():
        with tracker.phase("forward"):
            unseen = torch.empty(1000)  # no dispatch mode of its own: nobody handed it this one
            handed = torch.empty(256)
            tracker.see_outputs((handed, [handed.view(16, 16)]), "test")  # a view of it: the same storage
        assert tracker.peaks() == {"forward": 1024} and tracker.current_bytes() == 1024
        handed.untyped_storage().resize_(0)  # a storage resize (FSDP's free) still reaches it
        assert tracker.current_bytes() == 0
    del unseen, handed


def _profiler_relative_peak(fn) -> int:
    """Peak of (live - live at start) from the CPU allocator's profiler memory events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def test_training_step_matches_memtracker_and_profiler() -> None:
    from torch.distributed._tools.mem_tracker import MemTracker

    build = mlp_build()
    model, optimizer = build()
    mlp_step(model, optimizer, 32)  # AdamW state exists from here on
    meter = CpuExactMeter()
    meter.track_existing(model, optimizer)
    start = meter.current_bytes()
    with meter:
        mlp_step(model, optimizer, 32)
    ours = meter.peak_bytes()
    assert meter.current_bytes() == start  # temporaries all freed

    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        mlp_step(model, optimizer, 32)
    theirs = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    assert ours == theirs

    # The allocator also sees kernel-internal scratch (wrapped scalars...):
    # at least our peak, and only a few bytes more on this step.
    allocator_peak = _profiler_relative_peak(lambda: mlp_step(model, optimizer, 32))
    assert ours - start <= allocator_peak <= (ours - start) * 1.01


# ---------------------------------------------------------------- fake estimates
@pytest.mark.parametrize(
    ("checkpointing", "bf16"),
    [(False, False), (False, True), (True, False)],
    ids=["fp32", "bf16-autocast", "checkpointing"],
)
def test_fake_estimate_equals_real_step(checkpointing: bool, bf16: bool) -> None:
    build, step = make_build(checkpointing, **TINY), make_step(bf16)
    real_peak, real_phases = measure_real_peak(build, step, 4)
    est = estimate_step_peak(build, step, 4)
    assert abs(est.allocated_peak_bytes - real_peak) <= 0.01 * real_peak
    assert est.allocated_peak_bytes == real_peak  # exact in practice
    assert est.phase_peaks == real_phases
    assert est.peak_bytes == est.allocated_peak_bytes  # no emulation, no overheads
    assert 0 < est.step_start_bytes < est.allocated_peak_bytes
    model, optimizer = build()
    assert est.param_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    assert est.optimizer_state_bytes == 2 * est.param_bytes + 4 * len(list(model.parameters()))


def test_second_step_is_measured_not_the_cold_one() -> None:
    build, step = make_build(**TINY), make_step()
    cold = estimate_step_peak(build, step, 4, steps=1)
    warm = estimate_step_peak(build, step, 4, steps=2)
    assert warm.allocated_peak_bytes > cold.allocated_peak_bytes  # AdamW state created lazily
    assert warm.allocated_peak_bytes == measure_real_peak(build, step, 4)[0]


def test_fake_big_batch_does_not_allocate() -> None:
    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))
        return model, torch.optim.AdamW(model.parameters())

    def step(model: nn.Module, optimizer: torch.optim.Optimizer, batch_size: int) -> None:
        model(torch.randn(batch_size, 1024)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    gc.collect()
    proc = psutil.Process()
    rss0, maxrss0_kib = proc.memory_info().rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    est = estimate_step_peak(build, step, 100_000)
    rss1, maxrss1_kib = proc.memory_info().rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert est.peak_bytes > 4 * (1 << 30)  # activations of 100k x 4096 floats and more
    assert rss1 - rss0 < 64 * MIB
    assert (maxrss1_kib - maxrss0_kib) * 1024 < 64 * MIB


# ---------------------------------------------------------------- CUDA emulation
def test_cuda_emulation_rounds_to_512_bytes() -> None:
    tracker = StorageTracker(round_bytes=512)
    with tracker:
        one = torch.empty(1, dtype=torch.uint8)
        assert tracker.current_bytes() == 512
        more = torch.empty(513, dtype=torch.uint8)
        assert tracker.current_bytes() == 512 + 1024
        empty = torch.empty(0)
        assert tracker.current_bytes() == 1536
    del one, more, empty


def test_cuda_emulation_adds_overheads_and_assumptions() -> None:
    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = nn.Linear(1, 1, bias=False)  # a 4-byte parameter
        return model, torch.optim.AdamW(model.parameters())

    def step(model: nn.Module, optimizer: torch.optim.Optimizer, batch_size: int) -> None:
        model(torch.ones(batch_size, 1)).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    emu = CudaEmulation(context_overhead_bytes=500 * MIB, workspace_bytes=8 * MIB)
    plain = estimate_step_peak(build, step, 1)
    est = estimate_step_peak(build, step, 1, cuda_emulation=emu)
    assert est.param_bytes == 512 and plain.param_bytes == 4
    assert est.optimizer_state_bytes == 3 * 512  # exp_avg, exp_avg_sq, step
    assert est.allocated_peak_bytes % 512 == 0 and est.allocated_peak_bytes > plain.allocated_peak_bytes
    assert est.overhead_bytes == 508 * MIB
    assert est.peak_bytes == est.allocated_peak_bytes + 508 * MIB
    text = " ".join(est.assumptions)
    assert "512 B" in text and "500 MiB" in text and "8 MiB" in text and "foreach" in text
    assert not any("512 B" in a for a in plain.assumptions)


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_cuda_emulation_optimizer_impl_matches_real_impl(impl: str) -> None:
    emu = CudaEmulation(round_bytes=1, optimizer_impl=impl, context_overhead_bytes=0, workspace_bytes=0)
    est = estimate_step_peak(mlp_build(), mlp_step, 16, cuda_emulation=emu)
    real_build = mlp_build(foreach=True) if impl == "foreach" else mlp_build(fused=True)
    real_peak, real_phases = measure_real_peak(real_build, mlp_step, 16)
    assert est.allocated_peak_bytes == real_peak
    assert est.phase_peaks["optimizer"] == real_phases["optimizer"]
    forloop = estimate_step_peak(mlp_build(), mlp_step, 16)
    if impl == "foreach":  # foreach keeps whole-model temporaries: visibly more
        assert est.phase_peaks["optimizer"] > forloop.phase_peaks["optimizer"]


def test_cuda_emulation_rejects_bad_values() -> None:
    with pytest.raises(KronosTuneError):
        CudaEmulation(optimizer_impl="magic")  # type: ignore[arg-type]
    with pytest.raises(KronosTuneError):
        CudaEmulation(round_bytes=0)
    with pytest.raises(KronosTuneError):
        estimate_step_peak(mlp_build(), mlp_step, 0)


def test_fake_estimate_refuses_fake_cuda_tensors() -> None:
    def step(model: nn.Module, optimizer: torch.optim.Optimizer, batch_size: int) -> None:
        model(torch.randn(batch_size, 16, device="cuda")).sum().backward()

    with pytest.raises(KronosTuneError, match="CPU tensors"):
        estimate_step_peak(mlp_build(), step, 2)


# ---------------------------------------------------------------- budgets
def test_budget_raises_oom_in_backward_and_state_recovers() -> None:
    model, optimizer = mlp_build()()
    mlp_step(model, optimizer, 256)
    probe = CpuExactMeter()
    probe.track_existing(model, optimizer)
    with probe:
        mlp_step(model, optimizer, 256, meter=probe)
    peaks = probe.peaks()
    assert peaks["backward"] > peaks["forward"]
    budget = (peaks["forward"] + peaks["backward"]) // 2

    meter = CpuExactMeter(budget_bytes=budget)
    meter.track_existing(model, optimizer)
    pre_step = meter.current_bytes()
    with meter:
        with pytest.raises(torch.OutOfMemoryError, match=r"simulated device out of memory.*budget") as info:
            mlp_step(model, optimizer, 256, meter=meter)
    assert "tried to reach" in str(info.value) and "peak seen" in str(info.value)
    assert meter.num_ooms == 1
    assert "forward" in meter.peaks() and "optimizer" not in meter.peaks()
    del info
    optimizer.zero_grad(set_to_none=True)  # grads accumulated before the failure
    gc.collect()
    assert meter.current_bytes() == pre_step
    # Reusable: a smaller step fits and measures the same as a fresh meter.
    meter.reset()
    with meter:
        mlp_step(model, optimizer, 8, meter=meter)
    fresh = CpuExactMeter()
    fresh.track_existing(model, optimizer)
    with fresh:
        mlp_step(model, optimizer, 8, meter=fresh)
    assert meter.peak_bytes() == fresh.peak_bytes() and meter.peaks() == fresh.peaks()


def test_budget_on_fake_estimate() -> None:
    build, step = make_build(**TINY), make_step()
    peak = estimate_step_peak(build, step, 4).peak_bytes
    assert estimate_step_peak(build, step, 4, budget_bytes=peak).peak_bytes == peak  # exactly fits
    with pytest.raises(torch.OutOfMemoryError, match="simulated device out of memory"):
        estimate_step_peak(build, step, 4, budget_bytes=peak - 1)
    emu = CudaEmulation(context_overhead_bytes=MIB, workspace_bytes=0)
    with pytest.raises(KronosTuneError):  # budget smaller than the fixed overheads
        estimate_step_peak(build, step, 4, cuda_emulation=emu, budget_bytes=MIB // 2)


def test_memory_budget_message_and_validation() -> None:
    err = MemoryBudget(8 << 30).error(9 << 30, 7 << 30)
    assert isinstance(err, torch.OutOfMemoryError)
    assert str(err) == "simulated device out of memory: tried to reach 9.00 GiB, budget 8.00 GiB (peak seen 7.00 GiB)"
    with pytest.raises(KronosError, match="memory budget must be positive, got 0 bytes"):
        MemoryBudget(0)


def test_make_meter_on_cpu() -> None:
    meter = make_meter(torch.device("cpu"), budget_bytes=1024)
    assert isinstance(meter, CpuExactMeter)
    with pytest.raises(torch.OutOfMemoryError):
        with meter.phase("forward"):
            torch.empty(1025, dtype=torch.uint8)
    assert isinstance(make_meter(torch.device("cpu"), None), CpuExactMeter)
    assert make_meter("cpu", exact_on_cpu=False) is None  # plain CPU training runs unmetered


def test_phases_record_live_bytes_at_entry_and_exit() -> None:
    """What kronos_core's training benchmark reads: activations kept from forward to backward."""
    tracker = StorageTracker()
    kept = []
    with tracker.phase("forward"):
        kept.append(torch.empty(1000, dtype=torch.uint8))
        torch.empty(5000, dtype=torch.uint8)  # a temporary: in the peak, gone at the exit
    with tracker.phase("backward"):
        kept.clear()
    assert (tracker.entry_bytes["forward"], tracker.exit_bytes["forward"]) == (0, 1000)
    assert tracker.peaks()["forward"] == 6000
    assert (tracker.entry_bytes["backward"], tracker.exit_bytes["backward"]) == (1000, 0)
    tracker.reset()
    assert tracker.entry_bytes == {} and tracker.peaks() == {}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error path")
def test_cuda_only_helpers_fail_cleanly_without_cuda() -> None:
    with pytest.raises(KronosTuneError):
        CudaMeter()
    with pytest.raises(KronosTuneError):
        apply_cuda_budget(1 << 30)


# ---------------------------------------------------------------- CUDA
@pytest.mark.gpu
@needs_cuda
def test_cuda_meter_phase_peaks() -> None:
    meter = CudaMeter()
    base = meter.current_bytes()
    with meter.phase("forward"):
        x = torch.empty(1 << 20, device="cuda")  # 4 MiB
        y = torch.empty(1 << 18, device="cuda")  # 1 MiB
        del y
    with meter.phase("backward"):
        with meter.phase("inner"):
            z = torch.empty(1 << 19, device="cuda")  # 2 MiB
            del z
    peaks = meter.peaks()
    assert peaks["forward"] == base + 5 * MIB
    assert peaks["inner"] == base + 6 * MIB and peaks["backward"] == base + 6 * MIB
    assert meter.peak_bytes() == base + 6 * MIB
    assert meter.peak_reserved_bytes() >= meter.peak_bytes()
    del x


@pytest.mark.gpu
@needs_cuda
def test_cuda_budget_refuses_past_its_cap_and_fake_estimate_is_close() -> None:
    device = torch.device("cuda")  # bare, as users write it: every CUDA API below must accept it
    emu = CudaEmulation(context_overhead_bytes=0, workspace_bytes=0)
    build, step = make_build(d_model=256, n_heads=4, n_layers=2, seq_len=128, vocab=512), make_step()
    est = estimate_step_peak(build, step, 16, cuda_emulation=emu)

    def cuda_build() -> tuple[nn.Module, torch.optim.Optimizer]:
        model, _ = build()
        model = model.to(device)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def cuda_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch_size: int, meter) -> None:
        with torch.device(device):
            step(model, optimizer, batch_size, meter=meter)

    model, optimizer = cuda_build()
    meter = make_meter(device, None)
    cuda_step(model, optimizer, 16, meter)
    meter.reset()
    start = meter.current_bytes()  # includes cuBLAS workspace, which fake runs do not see
    cuda_step(model, optimizer, 16, meter)
    real_delta = meter.peak_bytes() - start
    fake_delta = est.allocated_peak_bytes - est.step_start_bytes
    assert abs(fake_delta - real_delta) <= 0.10 * real_delta, (fake_delta, real_delta)

    capped = make_meter(device, budget_bytes=torch.cuda.memory_allocated(device) + 64 * MIB)
    assert isinstance(capped, CudaMeter) and "capped" in capped.notes[0]
    try:
        with pytest.raises(torch.OutOfMemoryError):
            with capped.phase("forward"):
                torch.empty(1 << 30, dtype=torch.uint8, device=device)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, torch.cuda.current_device())
