"""The predict benchmark times what `kronos-tune predict` runs: a trial's recommended.toml, given to predict,
predicts the benchmark's own series with its settings and gives the forecast the benchmark's pass gave."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

from kronos_core.data.kline import FEATURE_COLUMNS
from kronos_core.predict.spec import build_predictor
from kronos_tune.benchmark.predict.pipeline import benchmark_series, predict_config, predict_pass
from kronos_tune.benchmark.predict.summary import recommended_settings
from kronos_tune.benchmark.results import PredictSettings
from kronos_tune.predict.config import PredictConfig, predictor_spec
from kronos_tune.predict.config_file import predict_file_toml, read_predict_file
from kronos_tune.predict.job import run_predict


def test_predict_with_the_recommended_file_reproduces_the_benchmarks_pass(tmp_path: Path, one_thread) -> None:
    settings = PredictSettings("tiny", lookback=32, pred_len=3, sample_count=2, series_count=100, measured_series=5,
                               seed=7, max_batch_size=4, chunk_series=2)
    path = tmp_path / "recommended.toml"
    path.write_text(predict_file_toml({k: v for k, v in recommended_settings(asdict(settings), "cpu").items()
                                       if v is not None}, ["test"]), encoding="utf-8")
    keys = read_predict_file(path)
    assert keys["synthetic"] == 5 and keys["seed"] == 7 and keys["chunk_series"] == 2 and keys["device"] == "cpu"
    assert keys["max_batch_size"] == 4 and keys["sample_count"] == 2 and keys["top_p"] == 0.9

    config = predict_config(settings, "cpu")
    series = benchmark_series(settings, "cpu")
    values = predict_pass(build_predictor(predictor_spec(config)), config, series)

    result = run_predict(PredictConfig(**keys))  # what `kronos-tune predict --config recommended.toml` runs
    assert result.job["chunk_series"] == 2 and result.series == 5
    by_name = dict(zip(result.series_names, result.frames))
    assert sorted(by_name) == sorted(series.names)  # the same synthetic series, by name
    predicted = np.stack([by_name[name][list(FEATURE_COLUMNS)].to_numpy() for name in series.names])
    np.testing.assert_array_equal(predicted, values)  # sampled (predict's decoding): per-series streams
