"""The work behind `kronos-tune backtest`: schedule origins, predict each (resumably), score, write the run folder.

No terminal output: notes go to `on_note(level, message)`, progress to
`on_progress(Progress)`; `kronos_tune.commands.backtest` renders them.

The windows of every (symbol, origin) are predicted through the prediction pipeline
(`kronos_tune.backtest.predictions`): chunks of a fixed size, kept as they finish, run in this process or
by torchrun ranks that claim them (--nproc), each window sampling from its own stream, so a window predicts
the same numbers in a fresh run, a resumed one, on any number of ranks, or as either side of `--compare`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from kronos_core.errors import one_line
from kronos_core.predict.spec import PredictorSpec, build_predictor, load_weights
from kronos_core.units import format_duration
from kronos_tune.backtest.config import (DEFAULT_SYNTHETIC_ORIGINS, BacktestConfig, PredictionSetting, check_config,
                                         raise_top_k, short_model_name)
from kronos_tune.backtest.forecast import Forecaster
from kronos_tune.backtest.predictions import SlotJob, predict_slot, settings_for
from kronos_tune.backtest.leakage import check_spans, resolve_models, schedule_out_of_sample
from kronos_tune.backtest.origins import (EVERY_DAY, OriginSchedule, Universe, load_universe, parse_every,
                                         schedule_origins)
from kronos_tune.backtest.outputs import write_outputs
from kronos_tune.backtest.scoring import BacktestResult, every_in_bars, score_run
from kronos_tune.backtest.significance import hac_lag, min_origins, missing_stats
from kronos_tune.workloads import emulated_bf16_note
from kronos_tune.predict.config import resolve_device
from kronos_tune.predict.times import calendar_grid
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.job_state import JobProgress
from kronos_tune.predict.shards import check_shards
from kronos_tune.runs import RunInterrupted, claim_run_dir, default_run_dir
from kronos_tune.time_left import TimeLeft, seconds_left

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
    predict_seconds: float  # this invocation's, from its first chunk's start (the predictor built)
    resumed: int = 0  # of `predicted`, saved before this invocation

    @property
    def symbols_per_s(self) -> float:
        """This invocation's rate: the symbol-origins saved before it took none of its time."""
        done = self.predicted - self.resumed
        return done / self.predict_seconds if self.predict_seconds > 0 and done > 0 else 0.0

    @property
    def seconds_left(self) -> float | None:
        return seconds_left(self.predicted - self.resumed, self.predict_seconds, self.total - self.predicted)


ProgressCallback = Callable[[Progress], None]
# Builds the forecaster for a setting; called at most once per setting, only when something is left to predict.
ForecasterFactory = Callable[[PredictionSetting, Callable[[int], None]], Forecaster]


@dataclass
class Session:
    """What this invocation predicted (a resumed run predicts only what was missing)."""

    predicted: int = 0
    predict_seconds: float = 0.0
    per_setting: list[tuple[int, float]] = field(default_factory=list)  # (predicted, seconds) per setting, in order
    notes: list[tuple[str, str]] = field(default_factory=list)

    @property
    def symbol_origins_per_s(self) -> float | None:
        return self.predicted / self.predict_seconds if self.predict_seconds > 0 else None


def synthetic_rows(config: BacktestConfig, origins: int) -> int:
    """Bars per synthetic symbol so the schedule holds exactly `origins` origins (48 five-minute bars a day)."""
    every = config.every_bars
    if every == EVERY_DAY:
        return config.lookback + config.pred_len + (origins + 1) * 48
    return config.lookback + config.pred_len + (origins - 1) * int(every)


def _setting_notes(config: BacktestConfig, note: NoteCallback) -> None:
    settings = [config.setting] + ([config.compare] if config.compare is not None else [])
    asked = [f"{flag} bf16" for setting, flag in zip(settings, ("--amp", "--compare")) if setting.amp == "bf16"]
    emulated = emulated_bf16_note(" and ".join(asked) or None, resolve_device(config.device))
    if emulated:
        note("note", emulated)
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
    unavailable = missing_stats()
    if unavailable is not None:
        note("warning", f"{unavailable}: the significance tests are not available; every other figure is computed")
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
                 forecaster_factory: ForecasterFactory | None = None) -> BacktestResult | None:
    """Run (or resume) a backtest; the run folder keeps every finished origin even when interrupted. None on a
    node of an --nnodes run whose ranks are done while another node (the last setting's rank 0) scores the run."""
    session = Session()

    def note(level: str, message: str) -> None:
        session.notes.append((level, message))
        if on_note is not None:
            on_note(level, message)

    device = resolve_device(config.device)
    config = resolve_models(_with_every(config))
    check_config(config, device)
    if config.launch.launched:
        check_shards(config.launch, device.split(":")[0])
    if config.checkpoint is None and forecaster_factory is None:
        note("warning", RANDOM_WEIGHTS_NOTE)
    origins_wanted = config.origins
    if config.synthetic is not None and origins_wanted is None:
        origins_wanted = DEFAULT_SYNTHETIC_ORIGINS
        note("note", f"--synthetic without --origins: {origins_wanted} origins")
    weights = _resolve_weights(config, note)  # a hub id that is not cached fails here, before any data or folder
    rows = synthetic_rows(config, origins_wanted or 1)
    universe = load_universe(config.data, config.synthetic, rows, config.seed, note, config.symbol_column,
                             config.date_format)
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
    run = claim_run_dir(folder, "backtest", config.identity(), resume=config.resume, overwrite=config.overwrite,
                        join=config.launch.multi_node)
    note("note", f"run folder: {run.path}" + (" (resumed)" if run.resumed else " (joined: another node started it)"
                                              if run.mode == "join" else ""))
    run.mark("running", origins=len(schedule.origins), symbols=len(schedule.used_symbols),
             **({"weights": {label: source.to_dict() for label, source in weights.items()}} if weights else {}))
    settings = [config.setting] + ([config.compare] if config.compare is not None else [])
    predictors = PredictorCache(note)
    elsewhere = False
    estimate = TimeLeft(time.perf_counter)  # the whole prediction's, for "first estimate X, actual Y"
    try:
        for position, (slot, setting) in enumerate(zip(SLOTS, settings)):
            job = slot_job(config, slot, setting, device, weights, custom=forecaster_factory is not None)
            forecaster = None if forecaster_factory is None else (
                lambda setting=setting: forecaster_factory(setting, lambda _count: None))
            with warnings.catch_warnings():
                # A lookback longer than max_context is reported once, above.
                warnings.filterwarnings("ignore", message=r"a history of \d+ rows is longer than max_context")
                outcome = predict_slot(job, universe, schedule, run.path, futures, note,
                                       lambda spec=job.spec: predictors.get(spec), forecaster,
                                       _progress_adapter(job.label, schedule, note, on_progress, estimate,
                                                         [s.label() for s in settings[position + 1:]]))
            # --nnodes: the node that ran a setting's rank 0 writes its origin files; the one that ran the last
            # setting's rank 0 scores the run (the settings run in turn, each group waiting for every node)
            elsewhere = outcome.elsewhere
            if elsewhere:
                continue
            session.predicted += outcome.predicted
            session.predict_seconds += outcome.seconds
            session.per_setting.append((outcome.predicted, outcome.seconds))
            if config.launch.multi_node:  # keep what the other nodes recorded (their settings' ranks)
                run.take_fields_of_other_nodes()
            run.mark("running", **{f"origins_saved_{slot}": len(schedule.origins)},
                     **({f"ranks_{slot}": outcome.ranks} if outcome.ranks else {}))
        if elsewhere:
            return None
        if config.launch.multi_node:
            run.take_fields_of_other_nodes()
        timing = estimate.first_vs_actual()
        if timing is not None:
            note("note", f"prediction time: {timing} (the first estimate came after the first chunk)")
        result = score_run(config, universe, schedule, run.path, settings)
        result.overlap = overlap
        result.notes = session.notes
        result.session_predicted = session.predicted
        result.session_predict_seconds = session.predict_seconds
        result.session_per_setting = list(session.per_setting)
        result.plot = write_outputs(result, run.path, note)
    except KeyboardInterrupt:
        run.mark("cancelled", **_timing(session))
        raise RunInterrupted(run.path) from None
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


def slot_job(config: BacktestConfig, slot: str, setting: PredictionSetting, device: str, weights: dict,
             custom: bool = False) -> SlotJob:
    """One setting's prediction job: the predictor (another model's folders for --compare checkpoint=...), its
    chunk settings, the launch and what a resumed slot must match."""
    if setting.checkpoint is not None:
        model = dict(checkpoint=str(setting.checkpoint), tokenizer=str(setting.tokenizer))
    else:
        checkpoint, tokenizer = weights.get("checkpoint"), weights.get("tokenizer")
        model = dict(size=config.size, checkpoint=None if checkpoint is None else str(checkpoint.path),
                     tokenizer=None if tokenizer is None else str(tokenizer.path))
    spec = None if custom else PredictorSpec(**model, seed=config.seed, device=device,
                                             amp=None if setting.amp == "none" else setting.amp,
                                             max_context=config.max_context(setting), window_mode=setting.window_mode)
    return SlotJob(slot=slot, label=setting.label(), lookback=config.lookback, pred_len=config.pred_len,
                   settings=settings_for(setting, config.seed), spec=spec, launch=config.launch,
                   chunk_series=config.chunk_series, identity={**config.identity(), "slot": slot,
                                                             "slot_setting": setting.to_dict()})


class PredictorCache:
    """Predictors built on weights loaded once per model (both sides of --compare share them); a warning
    while loading becomes a note."""

    def __init__(self, note: NoteCallback) -> None:
        self.note = note
        self.weights: dict[tuple, object] = {}

    def get(self, spec: PredictorSpec):
        key = (spec.size, spec.checkpoint, spec.tokenizer, spec.seed)
        if key not in self.weights:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.weights[key] = load_weights(spec)
            for warning in caught:
                self.note("warning", str(warning.message))
        return build_predictor(spec, self.weights[key])  # type: ignore[arg-type]


def _progress_adapter(label: str, schedule: OriginSchedule, note: NoteCallback,
                      on_progress: ProgressCallback | None, estimate: TimeLeft,
                      later: list[str]) -> Callable[[JobProgress], None]:
    """The pipeline's progress as the backtest's (origins done from the windows done), and one line with the
    time left once the first chunk of this invocation has given a rate: this setting's, and with `later`
    settings (--compare) theirs at the same rate and the total."""
    ends = np.cumsum([len(o.members) for o in schedule.origins])
    told = [False]

    def hear(progress: JobProgress) -> None:
        done = progress.series_done - progress.series_resumed
        left = progress.series_total - progress.series_done
        figure = seconds_left(done, progress.seconds, left)
        if not told[0] and figure is not None:
            told[0] = True
            text = (f"[{label}] {done / progress.seconds:.1f} symbol-origins/s on the first chunk: about "
                    f"{format_duration(figure)} for the {left} left")
            then = seconds_left(done, progress.seconds, left + len(later) * schedule.predictions)
            if later:
                text += (f"; {', '.join(later)} next, {schedule.predictions} more at this rate: about "
                         f"{format_duration(then)} in all")
            estimate.expect(then)
            note("note", text)
        if on_progress is not None:
            origins = int(np.searchsorted(ends, progress.series_done, side="right"))
            on_progress(Progress(label, origins, len(schedule.origins), progress.series_done, progress.series_total,
                                 progress.seconds, progress.series_resumed))

    return hear
