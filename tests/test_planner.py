"""`kronos-tune plan`'s estimates from one traced session per set-up: the peak line by batch size against
exact traces, and the trace cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from kronos_core.train import TrainConfig
from kronos_tune.memory import planner
from kronos_tune.memory.estimate import CudaEmulation, EstimateResult, PeakLine, StepTrace
from kronos_tune.memory.trace_cache import CACHE_ENV
from kronos_tune.presets import load_preset_file
from tests.tiny_preset import tiny_preset_toml

EMULATION = CudaEmulation(context_overhead_bytes=0)  # with the allocator's 512-byte rounding, as on a CUDA preset


def tiny_config(parallelism: str) -> TrainConfig:
    return TrainConfig(model_size="tiny", lookback_window=16, predict_window=4, batch_size=8, device="cpu",
                       parallelism=parallelism)


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_peak_line_matches_exact_traces_at_batches_it_was_not_fitted_at(parallelism: str) -> None:
    config = tiny_config(parallelism)
    session = planner._session(config, 8, 2, EMULATION)  # traces batches 2 and 8 after a warm-up step
    assert sorted(session.probes) == [2, 8] and session.line is not None
    assert session.line.peak_at(2) == session.probes[2].peak and session.line.peak_at(8) == session.probes[8].peak
    exact = planner.estimate_setup_peak(config, 13, 2, EMULATION)  # a fresh trace, as every probe was before
    assert session.line.peak_at(13) == pytest.approx(exact, rel=0.02)
    assert abs(session.line.peak_at(13) - exact) <= 512 * 64  # in practice: the allocator's rounding only
    if parallelism == "fsdp":  # a batch measured right after another one's step equals a fresh trace of it
        assert session.probes[8].peak == planner.estimate_setup_peak(config, 8, 2, EMULATION)
    # batch 1 is off the line (size-1 dimensions make views): a row that needs it gets a trace of its own
    probes = planner._SetupProbes(config, 2, EMULATION, session)
    assert probes(1).peak == planner.estimate_setup_peak(config, 1, 2, EMULATION) + (
        probes(1).grads // 2 if parallelism == "ddp" else 0)  # DDP's buckets, as every row adds them


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_a_primed_build_steps_like_one_after_a_warm_up_step(parallelism: str) -> None:
    config = tiny_config(parallelism)
    primed = planner._trace(config, (4,), 2, EMULATION)[0][1]
    warmed = planner._trace(config, (4,), 2, EMULATION, primed=False)[0][1]
    assert primed.ops == warmed.ops and primed.live_bytes == warmed.live_bytes
    assert primed.result.optimizer_state_bytes == warmed.result.optimizer_state_bytes > 0
    # what the prime stands in for: a first step without it creates the state and tables the steady state has
    assert _cold_first_step(config).ops != primed.ops


def _cold_first_step(config: TrainConfig) -> StepTrace:
    from kronos_tune.autobatch.train_task import TrainTask
    from kronos_tune.memory.estimate import FakeEstimate
    from kronos_tune.memory.sharded import SimulatedRanks

    with SimulatedRanks(2) as ranks, TrainTask(config, mesh=ranks.mesh if config.parallelism == "fsdp" else None) \
            as task:
        holder = {}

        def build():
            probe = holder["probe"] = task.estimate_step_factory(4)
            return probe.model, probe.optimizer

        return FakeEstimate(build, lambda model, optimizer, size: holder["probe"].run(None, size), steps=1,
                            cuda_emulation=EMULATION).trace(4)[0]


def _trace(batch: int, ops: tuple[str, ...], live: tuple[int, ...]) -> StepTrace:
    result = EstimateResult(batch, max(live), max(live), 0, {}, 0, 0, 0, 0, live[0], 2)
    return StepTrace(result, ops, live)


def test_peak_line_follows_the_peak_from_one_point_of_the_step_to_another() -> None:
    # point a: 100 + 1 per sample (optimizer temporaries); point b: 10 + 10 per sample (activations)
    line = PeakLine.fit(_trace(2, ("start", "a", "b", "c"), (5, 102, 30, 6)),
                        _trace(20, ("start", "a", "b", "c"), (5, 120, 210, 6)))
    assert line is not None
    assert [line.peak_at(batch) for batch in (1, 2, 10, 11, 20, 100)] == [101, 102, 110, 120, 210, 1010]
    assert len(line.fixed) == 2  # points under another at every batch size are dropped
    assert PeakLine.fit(_trace(2, ("start", "a"), (5, 7)), _trace(20, ("start", "b"), (5, 9))) is None


@pytest.fixture()
def two_rank_tiny(tmp_path: Path):
    path = tmp_path / "tiny-2rank.toml"
    path.write_text(tiny_preset_toml("tiny-2rank", batch_size=4).replace("device_count = 1", "device_count = 2"),
                    encoding="utf-8")
    return load_preset_file(path)


def test_a_repeated_plan_reads_the_trace_cache_and_an_unreadable_entry_is_traced_again(
        two_rank_tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    first = planner.plan_preset(two_rank_tiny, sizes=("tiny",), setups=("fsdp", "fsdp+offload"))
    entries = list((tmp_path / "cache" / "traces").glob("*.json"))
    assert len(entries) == 1  # offload reuses the FSDP session
    real_trace = planner._trace

    def no_tracing(*args, **kwargs):
        raise AssertionError("traced although the cache holds the session")

    monkeypatch.setattr(planner, "_trace", no_tracing)
    assert planner.plan_preset(two_rank_tiny, sizes=("tiny",), setups=("fsdp", "fsdp+offload")) == first
    entries[0].write_text("{not json", encoding="utf-8")
    monkeypatch.setattr(planner, "_trace", real_trace)
    assert planner.plan_preset(two_rank_tiny, sizes=("tiny",), setups=("fsdp", "fsdp+offload")) == first
    monkeypatch.setenv(CACHE_ENV, "off")
    monkeypatch.setattr(planner, "_trace", no_tracing)
    with pytest.raises(AssertionError, match="traced although"):
        planner.plan_preset(two_rank_tiny, sizes=("tiny",), setups=("fsdp",))


def test_the_largest_fitting_batch_is_searched_from_a_guess_on_either_side() -> None:
    from kronos_tune.autobatch.search import search_largest

    def fits_up_to(largest: int):
        return lambda batch: batch <= largest

    assert search_largest(fits_up_to(12), 8, 1, 50)[0] == 12  # the guess too low (the line at 4x3080's large ddp)
    assert search_largest(fits_up_to(12), 30, 1, 50)[0] == 12  # too high
    assert search_largest(fits_up_to(99), 8, 1, 50)[0] == 50  # capped
    assert search_largest(fits_up_to(12), 8, 1, 13)[0] == 12  # a gallop past the top tries the top, then bisects
    assert search_largest(fits_up_to(2), 30, 1, 50)[0] == 2  # and past the bottom the bottom
    with pytest.raises(RuntimeError, match="even batch size 1 does not fit"):
        search_largest(fits_up_to(0), 8, 1, 50)
    found, calls = search_largest(fits_up_to(700), 650, 1, 4096)
    assert found == 700 and calls <= 16  # a gallop then a bisection, not a scan


def test_a_row_picks_the_largest_micro_batch_whose_exact_peak_fits() -> None:
    config = tiny_config("ddp")
    probes = planner._SetupProbes(config, 2, EMULATION, planner._session(config, 8, 2, EMULATION))
    peaks = {batch: probes(batch).peak for batch in range(2, 41)}
    for largest in range(2, 40):  # a budget between the peaks at `largest` and the next batch, no margin
        budget = (peaks[largest] + peaks[largest + 1]) // 2
        row = planner._row("ddp", probes, 2, budget, 0.0, 40, 40, offload=False)
        assert row.micro_batch == largest and row.peak_bytes == peaks[largest] <= budget, (largest, row.micro_batch)
        if largest == 23:
            assert row.train_micro_batch == 20 and row.accumulation_steps == 2  # the largest divisor of 40 under 23
