"""One rule for a predict call's size (kronos_core.predict.call_size), as the predictor applies it."""

from __future__ import annotations

import pytest

from kronos_core.errors import KronosError
from kronos_core.predict.call_size import CPU_MAX_ROWS, GPU_MAX_ROWS, rows_per_call, series_per_call
from kronos_core.predict.predictor import KronosPredictor
from kronos_core.sizes import build_model, build_tokenizer


def test_the_rule_without_a_model():
    assert rows_per_call("cpu") == CPU_MAX_ROWS == 256 and rows_per_call("cuda") == GPU_MAX_ROWS == 8192
    assert rows_per_call("cpu", fit=100, block_rows=61) == 61 and rows_per_call("cpu", fit=40, block_rows=61) == 40
    assert rows_per_call("cuda", fit=100_000, block_rows=61) == 8192  # the glibc block rule is the CPU's only
    assert rows_per_call("cpu", max_batch_size=1000, fit=1, block_rows=1) == 1000  # max_batch_size wins
    assert rows_per_call("cpu", fit=0) == 1
    assert series_per_call(256, 8) == 32 and series_per_call(5, 8) == 1
    with pytest.raises(KronosError, match="max_batch_size must be >= 1, got 0"):
        rows_per_call("cpu", max_batch_size=0)


def test_the_predictor_keeps_todays_cpu_sizes():
    # Kronos-mini at lookback 256 + 12 ran 61 windows a call before the rule moved (docs/backtest.md);
    # the tiny model's feed-forward is narrow enough that the 256 cap binds.
    mini = KronosPredictor(build_model("mini", seed=0), build_tokenizer("mini", seed=0), device="cpu")
    assert mini.rows_per_call(None, 256, 12) == 61
    assert mini.series_per_call(None, 256, 12, sample_count=4) == 15
    tiny = KronosPredictor(build_model("tiny", seed=0), build_tokenizer("tiny", seed=0), device="cpu")
    assert tiny.rows_per_call(None, 64, 4) == 256
    assert KronosPredictor(build_model("tiny", seed=0), build_tokenizer("tiny", seed=0), device="cpu",
                           max_batch_size=6).series_per_call(None, 64, 4, sample_count=4) == 1
