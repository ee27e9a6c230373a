"""The predict call size: how many sequences ``KronosPredictor.predict_batch`` runs at once.

A call holds ``series x sample_count`` sequences (``max_batch_size``). Its
peak memory is the model and tokenizer weights plus, per sequence, the
key/value cache and the prefill activations over the history: a floor plus a
line, like a training step. The search runs the generic ``autobatch`` with
one ``predict_batch`` call per probe (no optimizer), counted in series per call so that every probed size is
a whole number of series; the result is reported in sequences.

Throughput at the pick is measured afterwards without the meter (it slows
small ops down) on a few calls over synthetic series.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from kronos_core.predict.predictor import KronosPredictor
from kronos_core.predict.spec import PredictorSpec, build_predictor
from kronos_core.sizes import SIZES
from kronos_core.data.synthetic import synthetic_series
from kronos_tune.autobatch.probes import AutobatchResult, OnProbe, ProbeStep
from kronos_tune.autobatch.search import autobatch
from kronos_tune.presets import Preset


@dataclass
class PredictPick:
    """The call size for a predict workload (sequences = series x sample_count)."""

    result: AutobatchResult  # batch sizes in series per call
    sample_count: int
    series_count: int
    series_per_s: list[float] = field(default_factory=list)  # one value per timed repeat

    @property
    def series_per_call(self) -> int:
        return self.result.batch_size

    @property
    def max_batch_size(self) -> int:
        """The value for ``KronosPredictor(max_batch_size=...)`` / ``predict_batch(max_batch_size=...)``."""
        return self.result.batch_size * self.sample_count

    @property
    def median_series_per_s(self) -> float | None:
        return statistics.median(self.series_per_s) if self.series_per_s else None


class PredictProbes:
    """Synthetic series of the predict workload's shape, and factories that run one call over them."""

    def __init__(self, model_size: str, lookback: int, pred_len: int, sample_count: int = 1, series_count: int = 1,
                 device: str = "cpu", amp: str | None = None, seed: int = 0) -> None:
        self.model_size = model_size
        self.lookback = lookback
        self.pred_len = pred_len
        self.sample_count = sample_count
        self.series_count = series_count
        self.device = torch.device(device).type
        self.amp = amp
        self.seed = seed
        self.max_context = SIZES[model_size].context
        frames = synthetic_series(series_count, n_rows=lookback + pred_len, seed=seed)
        self.histories: list[pd.DataFrame] = []
        self.x_stamps: list[pd.Series] = []
        self.y_stamps: list[pd.Series] = []
        for frame in frames:
            self.histories.append(frame.iloc[:lookback].drop(columns=["timestamps"]).reset_index(drop=True))
            self.x_stamps.append(frame["timestamps"].iloc[:lookback].reset_index(drop=True))
            self.y_stamps.append(frame["timestamps"].iloc[lookback:].reset_index(drop=True))
        self.notes = [f"probes predict synthetic series: {lookback} rows in, {pred_len} out, "
                      f"{sample_count} sample path(s) each, model {model_size} with random weights"]

    @classmethod
    def from_preset(cls, preset: Preset, device: str = "cpu") -> PredictProbes:
        p = preset.predict
        return cls(preset.workload.model_size, p.lookback, p.pred_len, p.sample_count, p.series_count, device)

    def predictor(self, max_batch_size: int | None = None) -> KronosPredictor:
        return build_predictor(PredictorSpec(size=self.model_size, seed=self.seed, device=self.device,
                                             max_context=self.max_context, amp=self.amp,
                                             max_batch_size=max_batch_size))

    def predict(self, predictor: KronosPredictor, series: int, series_per_call: int) -> list[pd.DataFrame]:
        torch.manual_seed(self.seed)
        return predictor.predict_batch(self.histories[:series], self.x_stamps[:series], self.y_stamps[:series],
                                       self.pred_len, sample_count=self.sample_count, verbose=False,
                                       max_batch_size=series_per_call * self.sample_count)

    def step_factory(self, series_per_call: int) -> ProbeStep:
        """One call of ``series_per_call`` series (the weights are built inside the probe, so they count)."""
        predictor = self.predictor(series_per_call * self.sample_count)
        series = min(series_per_call, self.series_count)

        def run() -> None:
            self.predict(predictor, series, series_per_call)

        return ProbeStep(run, predictor.model)

    def run(self, budget_bytes: int, margin: float | None = None, max_probes: int = 6, round_bytes: int = 1,
            on_probe: OnProbe | None = None, timing_calls: int = 3, timing_repeats: int = 1) -> PredictPick:
        """Largest call within the budget, then series/s at it over ``timing_calls`` calls."""
        result = autobatch(self.step_factory, budget_bytes, margin=margin, max_probes=max_probes, min_batch=1,
                           max_batch=self.series_count, device=self.device, steps_per_probe=1,
                           round_bytes=round_bytes, on_probe=on_probe)
        result.notes[:0] = self.notes
        if result.batch_size >= self.series_count:
            result.notes.append(f"all {self.series_count} series fit in one call")
        pick = PredictPick(result, self.sample_count, self.series_count)
        pick.series_per_s = self.throughput(result.batch_size, timing_calls, timing_repeats)
        return pick

    def throughput(self, series_per_call: int, calls: int = 3, repeats: int = 1) -> list[float]:
        """Series per second predicting ``calls`` calls (capped at the workload), without the meter."""
        series = min(self.series_count, series_per_call * calls)
        predictor = self.predictor(series_per_call * self.sample_count)
        rates: list[float] = []
        for _ in range(repeats):
            start = time.perf_counter()
            self.predict(predictor, series, series_per_call)
            rates.append(series / (time.perf_counter() - start))
        return rates

    def predict_config(self, pick: PredictPick) -> dict[str, Any]:
        return {"model_size": self.model_size, "lookback": self.lookback, "pred_len": self.pred_len,
                "sample_count": self.sample_count, "series_count": self.series_count,
                "max_batch_size": pick.max_batch_size, "series_per_call": pick.series_per_call,
                "max_context": self.max_context}
