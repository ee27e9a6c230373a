"""Per-series random streams: a series' forecast is the same however it is batched; greedy is untouched; the
backtest draws from the same streams and refuses to resume a run begun under the old draws."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from kronos_core.data.kline import FEATURE_COLUMNS, calendar_features, wall_clock_ns
from kronos_core.data.synthetic import synthetic_series
from kronos_core.errors import KronosError
from kronos_core.predict.predictor import KronosPredictor
from kronos_core.predict.streams import (DRAWS, ROW_BLOCK, RowStreams, _signed, as_int64_keys, mix64, mix64_int,
                                         pad_rows, sample_inverse_cdf, series_key)
from kronos_core.sizes import build_model, build_tokenizer
from kronos_tune.backtest.config import BacktestConfig, PredictionSetting
from kronos_tune.backtest.runner import run_backtest
from kronos_tune.errors import KronosTuneError
from kronos_tune.runs import RUN_FILE, claim_run_dir

COLUMNS = list(FEATURE_COLUMNS)
SAMPLED = dict(T=1.0, top_p=0.9, sample_count=2)


@pytest.fixture(scope="module")
def predictor():
    return KronosPredictor(build_model("tiny", seed=1), build_tokenizer("tiny", seed=2), device="cpu")


@pytest.fixture(scope="module")
def series():
    """(dfs, x timestamps, y timestamps, names) of 11 synthetic series, history 30, horizon 5."""
    frames = synthetic_series(11, 35, seed=5)
    dfs = [f[COLUMNS].iloc[:30].reset_index(drop=True) for f in frames]
    xs = [f["timestamps"].iloc[:30].reset_index(drop=True) for f in frames]
    ys = [f["timestamps"].iloc[30:].reset_index(drop=True) for f in frames]
    return dfs, xs, ys, [f"SYM{i}" for i in range(11)]


def _samples(predictor, dfs, xs, ys, names, **options):
    _, samples = predictor.predict_batch(dfs, xs, ys, 5, return_samples=True, verbose=False, keys=names,
                                         **{**SAMPLED, **options})
    return samples


# The key and the hash ------------------------------------------------------------------------------------------

def test_series_key_is_stable_63_bit_and_depends_on_name_and_last_bar():
    key = series_key("AAPL", 1_700_000_000_000_000_000)
    assert key == series_key("AAPL", 1_700_000_000_000_000_000)  # blake2b: no per-process salt
    assert 0 <= key < 2 ** 63
    others = {series_key("AAPL", 1_700_000_000_000_000_001), series_key("MSFT", 1_700_000_000_000_000_000),
              series_key("AAPL", -1), series_key("", 0)}
    assert key not in others and len(others) == 4


def test_tensor_hash_equals_the_unsigned_64_bit_reference():
    words = [0, 1, 2 ** 63 - 1, -1, -2 ** 63, 12_345_678_901_234_567, -987_654_321, 0x9E3779B97F4A7C15 - 2 ** 64]
    hashed = mix64(torch.tensor(words, dtype=torch.int64)).tolist()
    assert hashed == [_signed(mix64_int(w)) for w in words]


def test_uniforms_are_in_range_advance_per_draw_and_depend_on_every_part_of_the_key():
    keys = torch.arange(2000, dtype=torch.int64)
    streams = RowStreams(0, keys, 2)
    first, second = streams.uniforms(), streams.uniforms()
    assert first.shape == (4000,) and int(streams.counter) == 2
    assert bool(((first >= 0) & (first < 1)).all()) and not torch.equal(first, second)
    assert abs(float(first.mean()) - 0.5) < 0.02 and abs(float(first.std()) - 12 ** -0.5) < 0.02
    assert not torch.equal(first[0::2], first[1::2])  # the two paths of a series
    assert not torch.equal(first, RowStreams(1, keys, 2).uniforms())  # another seed
    # A row's stream is its own: the same series in another batch, at another position, draws the same numbers.
    alone = RowStreams(0, keys[7:8], 2)
    assert torch.equal(alone.uniforms(), first[14:16]) and torch.equal(alone.uniforms(), second[14:16])


def test_inverse_cdf_draws_in_proportion_and_never_a_masked_token():
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0]]).expand(20000, 5).contiguous()
    drawn = sample_inverse_cdf(probs, RowStreams(3, torch.arange(20000), 1).uniforms())
    counts = torch.bincount(drawn, minlength=5).double() / 20000
    assert counts[1] == 0 and counts[4] == 0
    assert torch.allclose(counts[[0, 2, 3]], torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), atol=0.015)
    edges = torch.tensor([0.0, 1 - 2 ** -24])  # the smallest and largest uniform
    assert sample_inverse_cdf(probs[:2], edges).tolist() == [0, 3]


def test_pad_rows_and_keys_checks():
    padded = pad_rows(torch.arange(6).view(3, 2))
    assert padded.shape[0] == ROW_BLOCK and padded[-1].tolist() == [4, 5]
    assert pad_rows(torch.zeros(8, 3)).shape == (8, 3)
    assert as_int64_keys([2 ** 64 - 1, 5], 2).tolist() == [-1, 5]
    with pytest.raises(ValueError, match="got 1 keys for 2 series"):
        as_int64_keys([1], 2)


# The predictor -------------------------------------------------------------------------------------------------

def test_sampled_forecast_is_the_same_alone_in_a_batch_reversed_and_chunked(predictor, series):
    dfs, xs, ys, names = series
    batch = _samples(predictor, dfs, xs, ys, names)
    reverse = _samples(predictor, dfs[::-1], xs[::-1], ys[::-1], names[::-1])[::-1]
    chunked = _samples(predictor, dfs, xs, ys, names, max_batch_size=6)  # 3 series (x 2 paths) per chunk
    for i in range(len(dfs)):
        alone = predictor.predict(dfs[i], xs[i], ys[i], 5, verbose=False, return_samples=True, key=names[i],
                                  **SAMPLED)[1]
        for other in (reverse[i], chunked[i], alone):
            np.testing.assert_array_equal(other, batch[i])
    assert not np.array_equal(batch[0][0], batch[0][1])  # the two paths draw differently


def test_static_cache_steps_draw_the_same_streams_alone_and_batched(series):
    dfs, xs, ys, names = series
    static = KronosPredictor(build_model("tiny", seed=1), build_tokenizer("tiny", seed=2), device="cpu",
                             static_cache=True)
    batch = _samples(static, dfs[:5], xs[:5], ys[:5], names[:5])
    alone = _samples(static, dfs[3:4], xs[3:4], ys[3:4], names[3:4])
    np.testing.assert_array_equal(alone[0], batch[3])


def test_arrays_with_series_keys_equal_predict_batch_with_names(predictor, series):
    dfs, xs, ys, names = series
    expected = _samples(predictor, dfs[:4], xs[:4], ys[:4], names[:4])
    x = np.stack([d.to_numpy(np.float32) for d in dfs[:4]])
    keys = [series_key(n, int(wall_clock_ns(s)[-1])) for n, s in zip(names[:4], xs[:4])]
    paths = predictor.predict_arrays(x, np.stack([calendar_features(s) for s in xs[:4]]),
                                     np.stack([calendar_features(s) for s in ys[:4]]), keys=keys, **SAMPLED)
    np.testing.assert_array_equal(paths, np.stack(expected))


def test_greedy_with_keys_equals_greedy_without(predictor, series):
    dfs, xs, ys, names = series
    dfs, xs, ys, names = dfs[:8], xs[:8], ys[:8], names[:8]  # whole row blocks: no padding changes the sums
    plain = predictor.predict_batch(dfs, xs, ys, 5, top_k=1, verbose=False)
    keyed = predictor.predict_batch(dfs, xs, ys, 5, top_k=1, verbose=False, keys=names, seed=9)
    for a, b in zip(plain, keyed):
        pd.testing.assert_frame_equal(a, b)


def test_another_name_seed_or_last_bar_draws_other_numbers(predictor, series):
    dfs, xs, ys, names = series
    base = _samples(predictor, dfs[:1], xs[:1], ys[:1], ["A"])[0]
    assert np.array_equal(base, _samples(predictor, dfs[:1], xs[:1], ys[:1], ["A"])[0])
    assert not np.array_equal(base, _samples(predictor, dfs[:1], xs[:1], ys[:1], ["B"])[0])
    assert not np.array_equal(base, _samples(predictor, dfs[:1], xs[:1], ys[:1], ["A"], seed=1)[0])
    later = [xs[0] + pd.Timedelta(days=1)]  # the same bars, one day later: tomorrow's run
    assert not np.array_equal(base, _samples(predictor, dfs[:1], later, ys[:1], ["A"])[0])


def test_keys_of_the_wrong_length_are_one_line_errors(predictor, series):
    dfs, xs, ys, names = series
    with pytest.raises(KronosError, match="one name per series"):
        predictor.predict_batch(dfs[:2], xs[:2], ys[:2], 5, keys=names[:1])
    x = np.stack([d.to_numpy(np.float32) for d in dfs[:2]])
    stamps = np.stack([calendar_features(s) for s in xs[:2]])
    with pytest.raises(KronosError, match="got 3 keys for 2 series"):
        predictor.predict_arrays(x, stamps, np.stack([calendar_features(s) for s in ys[:2]]), keys=[1, 2, 3])


# The backtest --------------------------------------------------------------------------------------------------

def test_backtest_run_begun_under_the_old_draws_refuses_resume(tmp_path: Path):
    config = BacktestConfig(size="tiny", lookback=32, pred_len=4, device="cpu", synthetic=4, origins=1, top_k=1,
                            setting=PredictionSetting(), out=tmp_path / "run")
    assert config.identity()["draws"] == DRAWS
    old = {k: v for k, v in config.identity().items() if k != "draws"}  # as a run of an earlier release wrote it
    claim_run_dir(tmp_path / "run", "backtest", old).mark("cancelled")
    with pytest.raises(KronosTuneError) as refused:
        run_backtest(replace(config, resume=True), on_note=lambda level, message: None)
    message = str(refused.value)
    assert "\n" not in message and f"draws: None there, '{DRAWS}' now" in message
    assert json.loads((tmp_path / "run" / RUN_FILE).read_text())["identity"] == old  # the old run is kept as it was


# The predict benchmark's exactness check -----------------------------------------------------------------------

def test_benchmark_sampled_run_is_the_same_whatever_the_chunk_size(one_thread):
    """The benchmark's passes go through predict's pipeline with each series' own stream: the sampled forecast
    does not depend on the chunk size or the call size; the greedy pass differs from it."""
    from kronos_core.predict.spec import build_predictor
    from kronos_tune.benchmark.predict.pipeline import benchmark_series, predict_config, predict_pass
    from kronos_tune.benchmark.results import PredictSettings
    from kronos_tune.predict.config import predictor_spec

    settings = PredictSettings("tiny", lookback=32, pred_len=3, sample_count=1, series_count=100, measured_series=5,
                               chunk_series=5)
    series = benchmark_series(settings, "cpu")

    def run(settings: PredictSettings, greedy: bool = False):
        config = predict_config(settings, "cpu")
        return predict_pass(build_predictor(predictor_spec(config)), config, series, greedy=greedy)

    whole = run(settings)
    chunked = run(replace(settings, max_batch_size=2, chunk_series=2))
    greedy = run(settings, greedy=True)
    np.testing.assert_array_equal(whole, chunked)
    assert whole.shape == (5, 3, 6) and not np.array_equal(whole, greedy)


def test_exact_class_fails_on_a_sampled_difference_and_says_so():
    from kronos_tune.benchmark.predict.decide import quality_check
    from kronos_tune.benchmark.results import TrialResult

    def trial(sampled: float | None) -> TrialResult:
        quality = {"series": 100, "reference": "recompute",
                   **({} if sampled is None else {"sampled_max_abs_diff": sampled})}
        return TrialResult("autobatch", "single", "ok", task="predict", output_max_abs_diff=0.0, quality=quality)

    same, differs, unmeasured = (quality_check(trial(s), 0.95) for s in (0.0, 0.3, None))
    assert same.passed and same.text == "identical greedy and sampled output to recompute's over 100 series"
    assert not differs.passed and "sampled output (per-series streams) differs" in differs.text
    assert differs.sampled_max_abs_diff == 0.3 and "a defect" in differs.text
    assert unmeasured.passed and unmeasured.text == "identical greedy output to recompute's over 100 series"
