"""`verbose=True` of the Python API: a bar of the autoregressive steps on stderr; nothing without it."""

from __future__ import annotations

import io

import pandas as pd
import pytest

from kronos_core.data.synthetic import synthetic_kline
from kronos_core.predict.predictor import KronosPredictor
from kronos_core.predict.step_bar import REDRAW_S, StepBar
from kronos_core.sizes import build_model, build_tokenizer

COLUMNS = ["open", "high", "low", "close", "volume", "amount"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_bar_shows_done_of_total_the_rate_and_the_time_left() -> None:
    clock, stream = FakeClock(), io.StringIO()
    bar = StepBar(40, stream=stream, clock=clock)
    assert bar.line(clock.now) == ("predict [........................] 0/40 steps, - steps/s, - left, "
                                   "0.0 s elapsed")
    clock.now += 5.0
    bar.advance(10)
    assert stream.getvalue().endswith("\rpredict [######..................] 10/40 steps, 2.0 steps/s, 15.0 s left, "
                                      "5.0 s elapsed")
    clock.now += REDRAW_S / 2
    bar.advance(1)  # too soon after the last draw: not drawn
    assert stream.getvalue().count("\r") == 1
    clock.now += 15.0 - REDRAW_S / 2
    bar.advance(29)  # the last step is always drawn
    bar.close()
    bar.close()
    assert stream.getvalue().endswith("\rpredict [########################] 40/40 steps, 2.0 steps/s, 0.0 s left, "
                                      "20.0 s elapsed\n")
    assert stream.getvalue().count("\r") == 2 and stream.getvalue().count("\n") == 1


def _series(count: int, lookback: int, pred_len: int) -> tuple[list, list, list]:
    frames = [synthetic_kline(lookback + pred_len, seed=s) for s in range(count)]
    histories = [f.iloc[:lookback] for f in frames]
    return ([h[COLUMNS].reset_index(drop=True) for h in histories],
            [h["timestamps"].reset_index(drop=True) for h in histories],
            [f["timestamps"].iloc[lookback:].reset_index(drop=True) for f in frames])


@pytest.fixture(scope="module")
def predictor() -> KronosPredictor:
    return KronosPredictor(build_model("tiny", seed=1), build_tokenizer("tiny", seed=2), device="cpu")


def test_verbose_predict_batch_draws_every_chunks_steps_on_stderr(predictor: KronosPredictor,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    dfs, xs, ys = _series(3, 40, 5)
    frames = predictor.predict_batch(dfs, xs, ys, 5, top_k=1, verbose=True, max_batch_size=2)
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("\rpredict [") and err.endswith("\n")
    last = err.rstrip("\n").rsplit("\r", 1)[1]
    assert last.startswith("predict [" + "#" * 24 + "] 10/10 steps, ")  # two chunks of five steps
    assert " steps/s, 0.0 s left, " in last
    quiet = predictor.predict_batch(dfs, xs, ys, 5, top_k=1, verbose=False, max_batch_size=2)
    assert capsys.readouterr() == ("", "")
    for a, b in zip(frames, quiet):
        pd.testing.assert_frame_equal(a, b)


def test_verbose_is_the_reference_default_of_predict(predictor: KronosPredictor,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    dfs, xs, ys = _series(1, 40, 6)
    predictor.predict(dfs[0], xs[0], ys[0], 6, top_k=1)
    assert " 6/6 steps, " in capsys.readouterr().err
    predictor.predict(dfs[0], xs[0], ys[0], 6, top_k=1, verbose=False)
    assert capsys.readouterr().err == ""
