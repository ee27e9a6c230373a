"""The prediction benchmark: phase clock, phase split, memory floor arithmetic, and the command itself."""

from __future__ import annotations

import pytest
import torch.nn as nn

from benchmarks import predict as bench
from benchmarks.predict_phases import (PhaseTimes, breakdown_lines, kv_bytes_per_step, mean_cache_length,
                                       split_phases, time_phases, weight_bytes_per_step)
from kronos_core.predict.predictor import KronosPredictor
from kronos_core.sizes import build_model, build_tokenizer
from kronos_core.data.synthetic import synthetic_series

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
    assert marks == ["prepare", "h2d"] + one_chunk * 2 + ["d2h"]  # 3 series in chunks of 2: two chunks


def test_split_phases_sums_chunks_and_separates_the_prefill():
    marks = [("prepare", 0.5), ("h2d", 1.0), ("encode", 1.5), ("step", 3.0), ("step", 3.5), ("step", 4.5),
             ("decode", 5.0), ("encode", 6.0), ("step", 8.0), ("step", 8.25), ("step", 8.5), ("decode", 9.0),
             ("d2h", 9.25)]
    phases = split_phases(0.0, marks, 9.5, pred_len=3)
    assert phases == PhaseTimes(prepare=0.5, h2d=0.5, encode=1.5, prefill=3.5, steps=2.0, decode=1.0, d2h=0.25,
                                output=0.25, step_count=4)
    assert phases.total == pytest.approx(9.5) and phases.host == pytest.approx(0.75)
    with pytest.raises(ValueError, match="expected 3 step marks before decode, got 2"):
        split_phases(0.0, marks[:5] + [("decode", 5.0)], 6.0, pred_len=3)


def test_time_phases_measures_a_real_call_and_detaches_the_clock(tiny):
    predictor = KronosPredictor(*tiny, device="cpu")
    dfs, xs, ys = _inputs(2, 80, 6)
    phases = time_phases(predictor, lambda: predictor.predict_batch(dfs, xs, ys, 6, top_k=1, verbose=False), 6)
    assert phases.step_count == 5
    assert min(phases.prepare, phases.h2d, phases.encode, phases.prefill, phases.steps, phases.decode, phases.d2h,
               phases.output) > 0
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
    runs = [PhaseTimes(prepare=0.05, h2d=0.0, encode=0.05, prefill=0.9, steps=0.6, decode=0.1, d2h=0.0, output=0.0,
                       step_count=30)]
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
    code = bench.main(["--size", "tiny", "--series", "3", "--lookback", "64", "--pred-len", "5",
                       "--repeats", "2", "--breakdown", "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("path"))
    assert header.split()[:8] == ["path", "first", "call", "steady", "median", "min", "max", "runs"]
    cached = next(line for line in out.splitlines() if line.startswith("cached ")).split()
    assert len(cached) == 6 and cached[-1] == "1"  # name, first call, steady median, min, max, runs
    assert "greedy outputs identical: True" in out
    assert "cached path phases (median of 2 runs" in out and "4 one-token steps" in out
    assert "host preparation" in out and "output frames" in out and "phase sum / timed = " in out
    assert "steps free" in out and "per-step memory floor" in out


def test_bench_panel_input_and_host_path(capsys, one_thread):
    code = bench.main(["--size", "tiny", "--series", "3", "--lookback", "40", "--pred-len", "3",
                       "--repeats", "1", "--input", "panel", "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "as panel" in out and "greedy outputs identical: True" in out
    assert bench.main(["--series", "4", "--lookback", "30", "--pred-len", "2", "--paths", "host",
                       "--repeats", "2", "--input", "panel"]) == 0
    out = capsys.readouterr().out
    assert "host path only (panel in and out, no model)" in out and out.splitlines()[-1].startswith("host")
