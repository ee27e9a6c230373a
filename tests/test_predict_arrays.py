"""The array and panel paths of prediction: equal to predict_batch, shared calendar work, panel checks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from kronos_core.data.kline import FEATURE_COLUMNS, calendar_features, calendar_features_ns, wall_clock_ns
from kronos_core.errors import KronosError
from kronos_core.predict.panel import panel_inputs, predict_panel
from kronos_core.predict.predictor import KronosPredictor
from kronos_core.sizes import build_model, build_tokenizer
from kronos_core.data.synthetic import synthetic_series

COLUMNS = list(FEATURE_COLUMNS)


@pytest.fixture(scope="module")
def predictor():
    return KronosPredictor(build_model("tiny", seed=1), build_tokenizer("tiny", seed=2), device="cpu")


def _lists(frames, lookback, pred_len):
    dfs = [f[COLUMNS].iloc[-(lookback + pred_len):-pred_len].reset_index(drop=True) for f in frames]
    xs = [f["timestamps"].iloc[-(lookback + pred_len):-pred_len].reset_index(drop=True) for f in frames]
    ys = [f["timestamps"].iloc[-pred_len:].reset_index(drop=True) for f in frames]
    return dfs, xs, ys


def _arrays(dfs, xs, ys):
    x = np.stack([d.to_numpy(np.float32) for d in dfs])
    x_stamp = np.stack([calendar_features(s) for s in xs])
    y_stamp = np.stack([calendar_features(s) for s in ys])
    return x, x_stamp, y_stamp


@pytest.mark.parametrize("lookbacks", [(40,), (40, 25)])
def test_arrays_equal_predict_batch_greedy_for_each_length(predictor, lookbacks):
    frames = synthetic_series(4, 60, seed=3)
    dfs, xs, ys = [], [], []
    for k, frame in enumerate(frames):  # lengths alternate when two are given
        d, x, y = _lists([frame], lookbacks[k % len(lookbacks)], 6)
        dfs += d
        xs += x
        ys += y
    expected = predictor.predict_batch(dfs, xs, ys, 6, top_k=1, verbose=False)
    for lookback in lookbacks:
        members = [i for i, d in enumerate(dfs) if len(d) == lookback]
        paths = predictor.predict_arrays(*_arrays([dfs[i] for i in members], [xs[i] for i in members],
                                                  [ys[i] for i in members]), top_k=1)
        assert paths.shape == (len(members), 1, 6, 6) and paths.dtype == np.float32
        for position, i in enumerate(members):
            np.testing.assert_array_equal(paths[position, 0], expected[i].to_numpy())


def test_arrays_equal_predict_batch_when_sampling_several_paths(predictor):
    dfs, xs, ys = _lists(synthetic_series(3, 50, seed=4), 40, 5)
    torch.manual_seed(7)
    frames, samples = predictor.predict_batch(dfs, xs, ys, 5, sample_count=3, verbose=False, return_samples=True)
    torch.manual_seed(7)
    paths = predictor.predict_arrays(*_arrays(dfs, xs, ys), sample_count=3)
    torch.manual_seed(7)
    means = predictor.predict_arrays(*_arrays(dfs, xs, ys), sample_count=3, mean_only=True)
    assert paths.shape == (3, 3, 5, 6)
    for i in range(3):
        np.testing.assert_array_equal(paths[i], samples[i])
        np.testing.assert_array_equal(means[i], frames[i].to_numpy())
    assert not np.array_equal(paths[0, 0], paths[0, 1])


def test_array_input_errors(predictor):
    x = np.ones((2, 10, 6), np.float32)
    stamps = np.zeros((2, 10, 5), np.float32)
    with pytest.raises(KronosError, match=r"x must be \[N, L, 6\]"):
        predictor.predict_arrays(x[:, :, :5], stamps, np.zeros((2, 3, 5)))
    with pytest.raises(KronosError, match=r"y_stamp must be \[N, P, 5\]"):
        predictor.predict_arrays(x, stamps, np.zeros((3, 3, 5)))
    x[1, 4, 2] = np.nan
    with pytest.raises(KronosError, match="NaN or inf"):
        predictor.predict_arrays(x, stamps, np.zeros((2, 3, 5)))


def test_calendar_features_shared_across_series_equal_per_series_ones():
    frames = synthetic_series(3, 300, seed=5)
    grid = np.stack([wall_clock_ns(f["timestamps"]) for f in frames])
    grid[1] = grid[0]  # two series on one grid, one on another
    shared = calendar_features_ns(grid)
    for row in range(3):
        np.testing.assert_array_equal(shared[row], calendar_features(pd.Series(grid[row].view("datetime64[ns]"))))
    zoned = frames[0]["timestamps"].dt.tz_localize("Asia/Shanghai")
    np.testing.assert_array_equal(calendar_features_ns(wall_clock_ns(zoned)), calendar_features(zoned))
    as_text = frames[0]["timestamps"].astype(str).tolist()
    np.testing.assert_array_equal(wall_clock_ns(as_text), grid[0])


def _panel(frames, names):
    parts = [f.assign(symbol=name) for f, name in zip(frames, names)]
    return pd.concat(parts, ignore_index=True).sample(frac=1.0, random_state=0)  # rows in any order


def test_panel_round_trip_equals_per_series_prediction(predictor):
    frames = synthetic_series(3, 70, seed=6)
    names = ["600000.SH", "000001.SZ", "AAPL"]
    future = {name: pd.date_range(f["timestamps"].iloc[-1] + pd.Timedelta(minutes=5), periods=4, freq="5min")
              for name, f in zip(names, frames)}
    inputs = panel_inputs(_panel(frames, names), lookback=50, future=future)
    assert sorted(inputs.symbols) == sorted(names) and inputs.pred_len == 4
    out = predict_panel(predictor, inputs, top_k=1)
    assert list(out.columns) == ["symbol", "timestamps", *COLUMNS] and len(out) == 12
    per_symbol = predict_panel(predictor, inputs, top_k=1, output="frames")
    # The same series in the same order and batch (CPU matmuls round differently for other batch sizes).
    by_name = dict(zip(names, frames))
    dfs = [by_name[n][COLUMNS].iloc[-50:].reset_index(drop=True) for n in inputs.symbols]
    xs = [by_name[n]["timestamps"].iloc[-50:] for n in inputs.symbols]
    expected = predictor.predict_batch(dfs, xs, [future[n] for n in inputs.symbols], 4, top_k=1, verbose=False)
    for name, frame in zip(inputs.symbols, expected):
        rows = out[out["symbol"] == name]
        np.testing.assert_array_equal(rows[COLUMNS].to_numpy(), frame.to_numpy())
        assert list(rows["timestamps"]) == list(future[name])
        np.testing.assert_array_equal(per_symbol[name].to_numpy(), frame.to_numpy())
        assert list(per_symbol[name].index) == list(future[name])


def test_panel_future_from_a_function_is_called_once_per_grid(predictor):
    frames = synthetic_series(3, 40, seed=7)  # synthetic series share one timestamp grid
    calls = []

    def future(history: pd.DatetimeIndex, count: int):
        calls.append(len(history))
        return pd.date_range(history[-1] + pd.Timedelta(minutes=5), periods=count, freq="5min")

    inputs = panel_inputs(_panel(frames, ["a", "b", "c"]), lookback=30, future=future, pred_len=2)
    assert calls == [40] and inputs.future_ns.shape == (3, 2)


def test_panel_bad_input_is_one_line(predictor):
    frames = synthetic_series(2, 40, seed=8)
    panel = _panel(frames, ["a", "b"])
    shared = pd.date_range("2030-01-01", periods=2, freq="D")
    with pytest.raises(KronosError, match=r"no symbol column 'ticker' \(found: timestamps, open, .*symbol\)"):
        panel_inputs(panel, 30, shared, symbol_col="ticker")
    short = pd.concat([panel, frames[0].iloc[:5].assign(symbol="tiny")])
    with pytest.raises(KronosError, match="symbol tiny has 5 rows, fewer than lookback 30"):
        panel_inputs(short, 30, shared)
    skipping = panel_inputs(short, 30, shared, on_short="skip")
    assert skipping.symbols == ["a", "b"] or sorted(skipping.symbols) == ["a", "b"]
    assert skipping.skipped == [("tiny", "5 rows, fewer than lookback 30")]
    mixed = frames[1].copy()
    mixed.loc[20, "timestamps"] = mixed.loc[19, "timestamps"] + pd.Timedelta(minutes=1)
    with pytest.raises(KronosError, match="symbol b mixes bar intervals: a step of 0 days 00:01:00"):
        panel_inputs(_panel([frames[0], mixed], ["a", "b"]), 30, shared)
    twice = pd.concat([panel, panel.iloc[:1]])
    with pytest.raises(KronosError, match="twice; drop duplicates"):
        panel_inputs(twice, 30, shared)
    broken = panel.copy()
    broken.iloc[3, broken.columns.get_loc("close")] = np.nan
    with pytest.raises(KronosError, match=r"symbol [ab]: close is NaN or inf at"):
        panel_inputs(broken, 30, shared)
