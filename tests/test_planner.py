"""`kronos-tune plan`'s estimates from one traced session per set-up: the peak line by batch size against
exact traces, and the trace cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from kronos_core.train import TrainConfig
from kronos_tune.plan import planner, setup_traces
from kronos_tune.memory.estimate import CudaEmulation, StepTrace
from kronos_tune.memory.peak import PeakModel, largest_fitting
from kronos_tune.plan.trace_cache import CACHE_ENV
from kronos_tune.presets import load_preset_file
from tests.tiny_preset import tiny_preset_toml

EMULATION = CudaEmulation(context_overhead_bytes=0)  # with the allocator's 512-byte rounding, as on a CUDA preset


def tiny_config(parallelism: str) -> TrainConfig:
    return TrainConfig(model_size="tiny", lookback_window=16, predict_window=4, batch_size=8, device="cpu",
                       parallelism=parallelism)


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_the_peak_line_of_one_marker_step_matches_exact_traces_at_other_batch_sizes(parallelism: str) -> None:
    config = tiny_config(parallelism)
    (session,) = setup_traces.trace_session(config, 2, EMULATION)  # one primed build, one step at a marker batch size
    assert session.marker >= 1009
    for batch in (2, 8, 13):
        exact = setup_traces.estimate_setup_peak(config, batch, 2, EMULATION)  # a fresh trace of that batch size
        # what the line leaves out: the allocator's rounding of the scaled storages at another batch size
        assert 0 <= exact - session.line.peak_at(batch) <= 512 * 64, batch
    exact = setup_traces.trace_steps(config, (8,), 2, EMULATION)[0][0]
    assert (session.template.weights, session.template.grads, session.template.optimizer,
            session.template.step_start) == (exact.weights, exact.grads, exact.optimizer, exact.step_start)
    # batch 1 is off the line (size-1 dimensions make views): a row that needs it gets a trace of its own
    probes = setup_traces.SetupProbes(config, 2, EMULATION, session)
    assert probes(1).peak == setup_traces.estimate_setup_peak(config, 1, 2, EMULATION) + (
        probes(1).grads // 2 if parallelism == "ddp" else 0)  # DDP's buckets, as every row adds them


def test_checkpointing_switched_on_the_traced_model_gives_the_line_of_its_own_session() -> None:
    config = tiny_config("fsdp")
    plain, checkpointed = setup_traces.trace_session(config, 2, EMULATION, ("none", "all"))
    (alone,) = setup_traces.trace_session(config.replace(activation_checkpointing="all"), 2, EMULATION, ("all",))
    assert checkpointed == alone
    assert plain.line.peak_at(8) > checkpointed.line.peak_at(8)  # it recomputes instead of keeping activations


def test_the_marker_batch_is_a_prime_no_dimension_made_before_is_a_multiple_of() -> None:
    from kronos_tune.memory.estimate import MARKER_FLOOR, _marker_batch

    assert _marker_batch([4, 16, 832]) == MARKER_FLOOR == 1009
    assert _marker_batch([2 * 1009]) == 1013  # 1010..1012 are not prime
    assert _marker_batch([1009, 1013 * 3, 1019]) == 1021


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_a_primed_build_steps_like_one_after_a_warm_up_step(parallelism: str) -> None:
    config = tiny_config(parallelism)
    primed = setup_traces.trace_steps(config, (4,), 2, EMULATION)[0][1]
    warmed = setup_traces.trace_steps(config, (4,), 2, EMULATION, primed=False)[0][1]
    assert primed.ops == warmed.ops and primed.live_bytes == warmed.live_bytes
    assert primed.result.optimizer_state_bytes == warmed.result.optimizer_state_bytes > 0
    # what the prime stands in for: a first step without it creates the state and tables the steady state has
    assert _cold_first_step(config).ops != primed.ops


def _cold_first_step(config: TrainConfig) -> StepTrace:
    from kronos_tune.autobatch.train_probes import TrainProbes
    from kronos_tune.memory.estimate import FakeEstimate
    from kronos_tune.plan.setup_traces import SimulatedRanks

    with SimulatedRanks(2) as ranks, TrainProbes(config, mesh=ranks.mesh if config.parallelism == "fsdp" else None) \
            as task:
        holder = {}

        def build():
            probe = holder["probe"] = task.estimate_step_factory(4)
            return probe.model, probe.optimizer

        return FakeEstimate(build, lambda model, optimizer, size: holder["probe"].run(None, size), steps=1,
                            cuda_emulation=EMULATION).trace(4)[0]


def test_peak_line_follows_the_peak_from_one_point_of_the_step_to_another() -> None:
    # point a: 100 + 1 per sample (optimizer temporaries); point b: 10 + 10 per sample (activations); traced at
    # the marker batch 7, with what scales with the batch counted apart (here without rounding)
    marker = 7
    live = (5, 100 + marker, 10 + 10 * marker, 6)
    scaled = (0, marker, 10 * marker, 0)
    line = PeakModel.from_marker(marker, live, scaled, scaled)
    assert [line.peak_at(batch) for batch in (1, 2, 10, 11, 20, 100)] == [101, 102, 110, 120, 210, 1010]
    assert len(line.series) == 2  # points under another at every batch size are dropped
    assert line.largest_fitting(110, 1, 50) == 10 and line.largest_fitting(100, 1, 50) is None


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
    assert first.sizes[0].parameters == _tiny_parameter_count()  # the whole model's, counted on the sharded one
    entries = list((tmp_path / "cache" / "traces").glob("*.json"))
    assert len(entries) == 1  # offload reuses the FSDP session
    real_estimating = setup_traces.estimating

    def no_tracing(*args, **kwargs):
        raise AssertionError("traced although the cache holds the session")

    monkeypatch.setattr(setup_traces, "estimating", no_tracing)
    assert planner.plan_preset(two_rank_tiny, sizes=("tiny",), setups=("fsdp", "fsdp+offload")) == first
    entries[0].write_text("{not json", encoding="utf-8")
    monkeypatch.setattr(setup_traces, "estimating", real_estimating)
    assert planner.plan_preset(two_rank_tiny, sizes=("tiny",), setups=("fsdp", "fsdp+offload")) == first
    monkeypatch.setenv(CACHE_ENV, "off")
    monkeypatch.setattr(setup_traces, "estimating", no_tracing)
    with pytest.raises(AssertionError, match="traced although"):
        planner.plan_preset(two_rank_tiny, sizes=("tiny",), setups=("fsdp",))


def _tiny_parameter_count() -> int:
    from kronos_core.model import Kronos
    from kronos_core.sizes import size_spec

    return sum(parameter.numel() for parameter in Kronos(**size_spec("tiny").model).parameters())


def test_the_largest_fitting_batch_is_searched_from_a_guess_on_either_side() -> None:
    calls: list[int] = []

    def fits_up_to(largest: int):
        calls.clear()
        return lambda batch: calls.append(batch) or batch <= largest

    assert largest_fitting(fits_up_to(12), 1, 50, 8) == 12  # the guess too low (the line at 4x3080's large ddp)
    assert largest_fitting(fits_up_to(12), 1, 50, 30) == 12  # too high
    assert largest_fitting(fits_up_to(99), 1, 50, 8) == 50  # capped
    assert largest_fitting(fits_up_to(12), 1, 13, 8) == 12  # a gallop past the top tries the top, then bisects
    assert largest_fitting(fits_up_to(2), 1, 50, 30) == 2  # and past the bottom the bottom
    assert largest_fitting(fits_up_to(0), 1, 50, 8) is None  # not even the bottom
    assert largest_fitting(fits_up_to(700), 1, 4096, 650) == 700
    assert len(calls) <= 16  # a gallop then a bisection, not a scan


def test_a_guess_from_what_is_known_steers_the_search_and_can_end_it() -> None:
    calls: list[int] = []
    asked: list[tuple[int | None, int | None]] = []

    def fits(batch: int) -> bool:
        calls.append(batch)
        return batch <= 12

    def model(fit: int | None, failed: int | None) -> int | None:  # a fit that knows the answer after two runs
        asked.append((fit, failed))
        return 1 if fit is None else 8 if fit == 1 else 12

    assert largest_fitting(fits, 1, 50, model) == 12
    assert calls == [1, 8, 12] and asked == [(None, None), (1, None), (8, None), (12, None)]  # no run at 13
    calls.clear()
    assert largest_fitting(fits, 1, 50, lambda fit, failed: 40 if fit is None else None) == 12  # None: gallop, bisect
    assert calls[0] == 40 and calls[-1] in (12, 13) and 12 in calls and 13 in calls  # checked by 12 and 13
    calls.clear()
    assert largest_fitting(fits, 1, 50, lambda fit, failed: 60) == 12  # outside the bracket: the default steps
    assert calls[0] == 1 and 13 in calls
    calls.clear()
    assert largest_fitting(lambda batch: calls.append(batch) or False, 1, 50, lambda fit, failed: 5) is None
    assert calls == [5, 4, 2, 1]  # galloping down past the bottom tries the bottom


def test_a_row_picks_the_largest_micro_batch_whose_exact_peak_fits() -> None:
    config = tiny_config("ddp")
    probes = setup_traces.SetupProbes(config, 2, EMULATION, setup_traces.trace_session(config, 2, EMULATION)[0])
    peaks = {batch: probes(batch).peak for batch in range(2, 41)}
    for largest in range(2, 40):  # a budget between the peaks at `largest` and the next batch, no margin
        budget = (peaks[largest] + peaks[largest + 1]) // 2
        row = planner._row("ddp", probes, 2, budget, 0.0, 40, 40, offload=False)
        assert row.micro_batch == largest and row.peak_bytes == peaks[largest] <= budget, (largest, row.micro_batch)
        if largest == 23:
            assert row.train_micro_batch == 20 and row.accumulation_steps == 2  # the largest divisor of 40 under 23
