"""The prediction benchmark: phase clock, phase split, memory floor arithmetic, and the command itself."""

from __future__ import annotations

import pytest
import torch.nn as nn

from kronos_core import bench
from kronos_core.bench_phases import (PhaseTimes, breakdown_lines, kv_bytes_per_step, mean_cache_length, split_phases,
                                      time_phases, weight_bytes_per_step)
from kronos_core.predictor import KronosPredictor
from kronos_core.sizes import build_model, build_tokenizer
from kronos_core.synthetic import synthetic_series

COLUMNS = ["open", "high", "low", "close", "volume", "amount"]


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny", seed=1), build_tokenizer("tiny", seed=2)


def _inputs(count: int, lookback: int, pred_len: int):
    frames = synthetic_series(count, lookback + pred_len, seed=3)
    dfs = [f[COLUMNS].iloc[:lookback].reset_index(drop=True) for f in frames]
    xs = [f["timestamps"].iloc[:lookback].reset_index(drop=True) for f in frames]
    ys = [f["timestamps"].iloc[lookback:].reset_index(drop=True) for f in frames]
    return dfs, xs, ys


def test_phase_clock_marks_each_chunk_in_order(tiny):
    predictor = KronosPredictor(*tiny, device="cpu", max_batch_size=2)
    marks: list[str] = []
    predictor.phase_clock = marks.append
    predictor.predict_batch(*_inputs(3, 60, 4), 4, top_k=1, verbose=False)
    one_chunk = ["encode"] + ["step"] * 4 + ["decode"]
    assert marks == one_chunk * 2  # 3 series in chunks of 2: two chunks


def test_split_phases_sums_chunks_and_separates_the_prefill():
    marks = [("encode", 1.0), ("step", 3.0), ("step", 3.5), ("step", 4.5), ("decode", 5.0),
             ("encode", 6.0), ("step", 8.0), ("step", 8.25), ("step", 8.5), ("decode", 9.0)]
    phases = split_phases(0.0, marks, 9.5, pred_len=3)
    assert phases == PhaseTimes(encode=2.0, prefill=4.0, steps=2.0, decode=1.0, other=0.5, step_count=4)
    assert phases.total == pytest.approx(9.5)
    with pytest.raises(ValueError, match="expected 3 step marks before decode, got 2"):
        split_phases(0.0, marks[:3] + [("decode", 5.0)], 6.0, pred_len=3)


def test_time_phases_measures_a_real_call_and_detaches_the_clock(tiny):
    predictor = KronosPredictor(*tiny, device="cpu")
    dfs, xs, ys = _inputs(2, 80, 6)
    phases = time_phases(predictor, lambda: predictor.predict_batch(dfs, xs, ys, 6, top_k=1, verbose=False), 6)
    assert phases.step_count == 5
    assert min(phases.encode, phases.prefill, phases.steps, phases.decode) > 0
    assert predictor.phase_clock is None


def test_memory_floor_counts_every_weight_but_the_embedding_tables(tiny):
    model = tiny[0]
    tables = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Embedding))
    assert tables > 0
    assert weight_bytes_per_step(model) == 4 * (sum(p.numel() for p in model.parameters()) - tables)
    # keys + values of n_layers self-attention layers and the dependency layer, at the mean cache length
    expected = (2 * model.n_layers + 2) * 3 * (100 + 10) * model.d_model * 2
    assert kv_bytes_per_step(model, rows=3, history=100, pred_len=20, element_bytes=2) == expected
    assert mean_cache_length(100, 20) == 110
    assert mean_cache_length(100, 20, context=105) == (sum(range(101, 105)) + 105 * 15) / 19


def test_breakdown_ceilings_follow_from_the_phases(tiny):
    runs = [PhaseTimes(encode=0.1, prefill=0.9, steps=0.6, decode=0.1, other=0.0, step_count=30)]
    model = tiny[0]
    floor_bytes = weight_bytes_per_step(model) + kv_bytes_per_step(model, 8, 400, 30, 4)
    bandwidth = floor_bytes / 0.01  # a 10 ms floor per step
    lines = breakdown_lines(runs, model, 8, 400, 30, 4, bandwidth, recompute_seconds=17.0, context=512)
    assert "30 one-token steps 600 (20.00 per step)" in lines[0]
    assert "= 10.00 ms; measured step is 2.00x the floor" in lines[1]
    # measured 17 / 1.7 = 10x; steps free 17 / 1.1; at the floor 17 / (1.1 + 0.3) = 12.1x
    assert lines[2].endswith("measured 10.0x; steps free 15.5x; steps at the memory floor 12.1x")
    slid = breakdown_lines(runs, model, 8, 400, 30, 4, bandwidth, recompute_seconds=None, context=420)
    assert "slides after 20 steps" in slid[1] and "no one-token memory floor" in slid[1] and len(slid) == 2
    shifted = breakdown_lines(runs, model, 8, 400, 30, 4, bandwidth, None, context=420, window_mode="shift")
    assert "(mean length 413," in shifted[1]  # steps 1..19 see 401..419 positions, steps 20..29 see 420


def test_bench_predict_command_compares_paths_and_breaks_down(capsys, one_thread):
    code = bench.main(["predict", "--size", "tiny", "--series", "3", "--lookback", "64", "--pred-len", "5",
                       "--repeats", "1", "--breakdown", "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "greedy outputs identical: True" in out
    assert "cached path phases (median of 1 runs" in out and "4 one-token steps" in out
    assert "steps free" in out and "per-step memory floor" in out
