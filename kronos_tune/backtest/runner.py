"""The work behind `kronos-tune backtest`: schedule origins, predict each (resumably), score, write the run folder.

No terminal output: notes go to `on_note(level, message)`, progress to
`on_progress(Progress)`; `kronos_tune.commands.backtest` renders them.

Work is cut into fixed units before anything runs: several whole origins per
predict call when the universe is smaller than ``batch_size``, else one origin
split into calls of ``batch_size`` series. Each unit seeds the sampler from
(seed, its first origin), so a unit predicts the same numbers whether it runs
in a fresh run, a resumed one, or as either side of `--compare`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from kronos_core.errors import one_line
from kronos_core.predict.predictor import default_device
from kronos_tune.backtest.config import (DEFAULT_SYNTHETIC_ORIGINS, BacktestConfig, PredictionSetting, check_config,
                                         raise_top_k, short_model_name)
from kronos_tune.backtest.forecast import Forecaster, KronosForecaster, origin_windows
from kronos_tune.backtest.leakage import check_spans, resolve_models, schedule_out_of_sample
from kronos_tune.backtest.origins import EVERY_DAY, Origin, OriginSchedule, parse_every, schedule_origins
from kronos_tune.backtest.outputs import write_outputs
from kronos_tune.backtest.scoring import BacktestResult, every_in_bars, score_run
from kronos_tune.backtest.significance import STATS_WARNING, hac_lag, min_origins, missing_stats
from kronos_tune.backtest.store import origin_frame, origin_path, read_origin, write_origin
from kronos_tune.backtest.universe import Universe, load_universe
from kronos_tune.predict.times import calendar_grid
from kronos_tune.runs import RunDir, claim_run_dir, default_run_dir

RANDOM_WEIGHTS_NOTE = "random weights: the scores measure nothing about forecasting skill (agreement between " \
                      "settings still means something)"
SLOTS = ("a", "b")

NoteCallback = Callable[[str, str], None]


@dataclass
class Progress:
    """Where the prediction stands: symbol-origins predicted of the total, per setting."""

    setting: str
    origins_done: int
    origins_total: int
    predicted: int
    total: int
    predict_seconds: float

    @property
    def symbols_per_s(self) -> float:
        return self.predicted / self.predict_seconds if self.predict_seconds > 0 else 0.0


ProgressCallback = Callable[[Progress], None]
# Builds the forecaster for a setting; called at most once per setting, only when something is left to predict.
ForecasterFactory = Callable[[PredictionSetting, Callable[[int], None]], Forecaster]


@dataclass
class Session:
    """What this invocation predicted (a resumed run predicts only what was missing)."""

    predicted: int = 0
    predict_seconds: float = 0.0
    notes: list[tuple[str, str]] = field(default_factory=list)

    @property
    def symbol_origins_per_s(self) -> float | None:
        return self.predicted / self.predict_seconds if self.predict_seconds > 0 else None


def resolve_device(device: str) -> str:
    if device == "auto":
        return default_device()
    return "cuda:0" if device == "cuda" else device


def synthetic_rows(config: BacktestConfig, origins: int) -> int:
    """Bars per synthetic symbol so the schedule holds exactly `origins` origins (48 five-minute bars a day)."""
    every = config.every_bars
    if every == EVERY_DAY:
        return config.lookback + config.pred_len + (origins + 1) * 48
    return config.lookback + config.pred_len + (origins - 1) * int(every)


def work_units(origins: list[Origin], batch_size: int) -> list[list[Origin]]:
    """Consecutive origins packed up to batch_size series per unit (a larger origin is a unit of its own)."""
    units: list[list[Origin]] = []
    current: list[Origin] = []
    filled = 0
    for origin in origins:
        if current and filled + len(origin.members) > batch_size:
            units.append(current)
            current, filled = [], 0
        current.append(origin)
        filled += len(origin.members)
    if current:
        units.append(current)
    return units


def kronos_factory(config: BacktestConfig, device: str, note: NoteCallback,
                   weights: dict | None = None) -> ForecasterFactory:
    """Load each model's weights once (on first use) and build one KronosPredictor per setting on them;
    `weights`: the --checkpoint/--tokenizer folders already resolved (kronos_tune.predict.job.resolve_weights)."""
    loaded: dict[tuple[str | None, str | None], object] = {}

    def make(setting: PredictionSetting, on_chunk: Callable[[int], None]) -> Forecaster:
        from kronos_core.predict.predictor import KronosPredictor
        from kronos_tune.predict.job import PredictConfig, load_predictor

        key = (setting.checkpoint, setting.tokenizer)
        if key not in loaded:
            model = dict(size=config.size, checkpoint=config.checkpoint, tokenizer=config.tokenizer)
            resolved = weights
            if setting.checkpoint is not None:  # --compare checkpoint=...: another model
                model = dict(size=None, checkpoint=Path(setting.checkpoint), tokenizer=Path(str(setting.tokenizer)))
                resolved = None
            loaded[key] = load_predictor(PredictConfig(lookback=config.lookback, pred_len=config.pred_len, **model,
                                                       device=device, seed=config.seed), note, resolved)
        base = loaded[key]
        predictor = KronosPredictor(base.model, base.tokenizer, device=device,  # type: ignore[attr-defined]
                                    max_context=config.max_context(setting),
                                    amp=None if setting.amp == "none" else setting.amp,
                                    window_mode=setting.window_mode)
        return KronosForecaster(predictor, setting, config.batch_size, on_chunk, seed=config.seed)

    return make


def _setting_notes(config: BacktestConfig, note: NoteCallback) -> None:
    settings = [config.setting] + ([config.compare] if config.compare is not None else [])
    for setting in settings:
        context = config.max_context(setting)
        if config.lookback > context:
            note("warning", f"[{setting.label()}] --lookback {config.lookback} is longer than max_context {context}: "
                            f"the predictor sees the last {context} tokens of each history")
    if config.compare is not None and {config.setting.window_mode, config.compare.window_mode} == {"refill", "shift"}:
        slides = [config.lookback + config.pred_len > config.max_context(s) for s in settings]
        if not any(slides):
            note("note", f"the window never slides (lookback {config.lookback} + pred_len {config.pred_len} <= "
                         f"max_context): exact and shift predict the same; set max-context lower to compare them")


def _significance_notes(config: BacktestConfig, schedule: OriginSchedule, note: NoteCallback) -> None:
    """Before any prediction: whether the significance tests will be available at all."""
    if missing_stats() is not None:
        note("warning", STATS_WARNING)
        return
    lag = hac_lag(config.pred_len, every_in_bars(config, schedule))
    if len(schedule.origins) < min_origins(lag):
        note("warning", f"{len(schedule.origins)} origins: the significance tests at HAC lag {lag} (--pred-len "
                        f"{config.pred_len}, --every {config.every_bars}) need at least {min_origins(lag)}; they "
                        f"are reported as not available (more --origins, or a larger --every)")


def _label(config: BacktestConfig) -> str:
    model = config.size if config.size is not None else short_model_name(str(config.checkpoint)).replace("/", "-")
    data = f"synthetic{config.synthetic}" if config.synthetic is not None else Path(config.data[0]).stem
    return f"{model}-{data}"


def run_backtest(config: BacktestConfig, on_note: NoteCallback | None = None,
                 on_progress: ProgressCallback | None = None,
                 forecaster_factory: ForecasterFactory | None = None) -> BacktestResult:
    """Run (or resume) a backtest; the run folder keeps every finished origin even when interrupted."""
    session = Session()

    def note(level: str, message: str) -> None:
        session.notes.append((level, message))
        if on_note is not None:
            on_note(level, message)

    device = resolve_device(config.device)
    config = resolve_models(_with_every(config))
    check_config(config, device)
    if config.checkpoint is None and forecaster_factory is None:
        note("warning", RANDOM_WEIGHTS_NOTE)
    origins_wanted = config.origins
    if config.synthetic is not None and origins_wanted is None:
        origins_wanted = DEFAULT_SYNTHETIC_ORIGINS
        note("note", f"--synthetic without --origins: {origins_wanted} origins")
    weights = _resolve_weights(config, note)  # a hub id that is not cached fails here, before any data or folder
    rows = synthetic_rows(config, origins_wanted or 1)
    universe = load_universe(config.data, config.synthetic, rows, config.seed, note, config.symbol_column)
    overlap = check_spans(config, universe.synthetic, note)
    schedule = schedule_out_of_sample(lambda count: _schedule(config, universe, count), origins_wanted, overlap, note)
    if overlap.marking() is not None:
        note("warning", overlap.marking())
    if schedule.skipped_symbols:
        shown = ", ".join(schedule.skipped_symbols[:5]) + (" ..." if len(schedule.skipped_symbols) > 5 else "")
        note("note", f"skipped {len(schedule.skipped_symbols)} of {len(universe.symbols)} symbols with too little "
                     f"history for any origin (need --lookback {config.lookback} bars before and --pred-len "
                     f"{config.pred_len} after): {shown}")
    _setting_notes(config, note)
    _significance_notes(config, schedule, note)
    futures = calendar_futures(config, universe, schedule)

    folder = config.out if config.out is not None else default_run_dir("backtest", _label(config))
    run = claim_run_dir(folder, "backtest", config.identity(), resume=config.resume, overwrite=config.overwrite)
    note("note", f"run folder: {run.path}" + (" (resumed)" if run.resumed else ""))
    run.mark("running", origins=len(schedule.origins), symbols=len(schedule.used_symbols),
             **({"weights": {label: source.to_dict() for label, source in weights.items()}} if weights else {}))
    factory = forecaster_factory or kronos_factory(config, device, note, weights)
    settings = [config.setting] + ([config.compare] if config.compare is not None else [])
    try:
        for slot, setting in zip(SLOTS, settings):
            _predict_slot(config, universe, schedule, run, slot, setting, factory, session, on_progress, futures)
        result = score_run(config, universe, schedule, run.path, settings)
        result.overlap = overlap
        result.notes = session.notes
        result.session_predicted = session.predicted
        result.session_predict_seconds = session.predict_seconds
        result.plot = write_outputs(result, run.path, note)
    except KeyboardInterrupt:
        run.mark("cancelled", **_timing(session))
        raise
    except BaseException as error:
        run.mark("failed", error=one_line(error, typed=False), **_timing(session))
        raise
    run.mark("complete", **_timing(session))
    return result


def _resolve_weights(config: BacktestConfig, note: NoteCallback) -> dict:
    from kronos_tune.predict.job import resolve_weights

    return resolve_weights(config, note)


def _with_every(config: BacktestConfig) -> BacktestConfig:
    return replace(config, every=parse_every(config.every))


def _schedule(config: BacktestConfig, universe: Universe, origins: int | None) -> OriginSchedule:
    needed = config.top_k if config.long_only else 2 * config.top_k
    if universe.symbols and len(universe.symbols) < needed:  # an empty universe is schedule_origins' message
        raise_top_k(config, len(universe.symbols))
    return schedule_origins(universe, config.lookback, config.pred_len, config.every_bars, origins,
                            min_cross_section=max(2, needed))


def calendar_futures(config: BacktestConfig, universe: Universe,
                     schedule: OriginSchedule) -> dict[int, np.ndarray] | None:
    """With --calendar: each origin's next pred_len bar stamps on the exchange calendar (what a live forecast
    would be told), after checking every bar of the universe against that calendar."""
    if config.calendar is None or not schedule.origins:
        return None
    timeline = pd.DatetimeIndex(np.unique(np.concatenate([s.stamps for s in universe.symbols])))
    grid = calendar_grid(config.calendar, timeline, universe.source)
    return {o.index: grid.after(o.timestamp, config.pred_len, universe.source).as_unit("ns").to_numpy()
            for o in schedule.origins}


def _timing(session: Session) -> dict[str, object]:
    return {"session_predicted": session.predicted, "session_predict_seconds": round(session.predict_seconds, 3),
            "symbol_origins_per_s": session.symbol_origins_per_s}


def _predict_slot(config: BacktestConfig, universe: Universe, schedule: OriginSchedule, run: RunDir, slot: str,
                  setting: PredictionSetting, factory: ForecasterFactory, session: Session,
                  on_progress: ProgressCallback | None, futures: dict[int, np.ndarray] | None = None) -> None:
    """Predict every origin of one setting that has no complete file yet (`futures`: see calendar_futures)."""
    done = {o.index for o in schedule.origins
            if read_origin(origin_path(run.path, slot, o.index), len(o.members)) is not None}
    total = schedule.predictions
    state = Progress(setting.label(), len(done), len(schedule.origins),
                     sum(len(o.members) for o in schedule.origins if o.index in done), total, 0.0)
    pending = [u for u in work_units(schedule.origins, config.batch_size) if any(o.index not in done for o in u)]
    if not pending:
        return
    started = time.perf_counter()

    def on_chunk(series: int) -> None:
        state.predicted += series
        state.predict_seconds = time.perf_counter() - started
        if on_progress is not None:
            on_progress(state)

    forecaster = factory(setting, on_chunk)
    if on_progress is not None:
        on_progress(state)
    for unit in pending:
        windows = [w for o in unit for w in origin_windows(universe, o, config.lookback, config.pred_len,
                                                           None if futures is None else futures[o.index])]
        torch.manual_seed(config.seed * 1_000_003 + unit[0].index)
        before, unit_started = state.predicted, time.perf_counter()
        output = np.asarray(forecaster(windows, config.pred_len), dtype=np.float64)
        samples = output if output.ndim == 2 and output.shape[1] >= 2 else None
        closes = output.mean(axis=1) if output.ndim == 2 else output
        session.predict_seconds += time.perf_counter() - unit_started
        session.predicted += len(windows)
        state.predicted = before + len(windows)  # also when the forecaster does not report chunks
        offset = 0
        for origin in unit:
            count = len(origin.members)
            if origin.index not in done:
                frame = origin_frame(windows[offset:offset + count], origin.timestamp, closes[offset:offset + count],
                                     None if samples is None else samples[offset:offset + count])
                write_origin(origin_path(run.path, slot, origin.index), frame)
                state.origins_done += 1
            offset += count
        state.predict_seconds = time.perf_counter() - started
        run.mark("running", **{f"origins_saved_{slot}": state.origins_done})
        if on_progress is not None:
            on_progress(state)
