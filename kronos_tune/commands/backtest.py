"""`kronos-tune backtest`: rolling predictions over many symbols, IC / RankIC, a cost-aware portfolio curve,
and with --compare how much a second prediction setting changes the ranking."""

from __future__ import annotations

import math
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kronos_core.units import format_duration
from kronos_tune.commands.common import (AmpOption, CalendarOption, CheckpointOption, DateFormatOption,
                                         DeviceOption, LiveProgress, NnodesOption, NodeRankOption, OfflineOption,
                                         RdzvBackendOption, RdzvEndpointOption, RdzvIdOption, SampleCountOption,
                                         SeedOption, SizeOption, TemperatureOption, TopPOption, WindowModeOption,
                                         make_console)
from kronos_tune.predict.chunk_size import HOW_CHOSEN

if TYPE_CHECKING:  # the runner imports torch; load it only when the command runs
    from kronos_tune.backtest.runner import Progress
    from kronos_tune.backtest.scoring import BacktestResult


def _num(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.{digits}f}"


def _pct(value: float | None, signed: bool = True) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{100 * value:+.2f} %" if signed else f"{100 * value:.2f} %"


BAND_ROWS = (
    ("coverage P10-P90 (nominal 80 %)", lambda b: _pct(b["coverage_p10_p90"], signed=False)),
    ("coverage P25-P75 (nominal 50 %)", lambda b: _pct(b["coverage_p25_p75"], signed=False)),
    ("pinball P10 / P50 / P90 / last close", lambda b: " / ".join(_num(b[f"pinball_p{q}"], 5) for q in (10, 50, 90))),
    ("CRPS / last close", lambda b: _num(b["crps"], 5)),
)


def _test(test, digits: int = 2) -> str:
    """A MeanTest's 't, p' cell (the reason is in the verdict lines below the table)."""
    if test is None:
        return "-"
    if test.reason is not None:
        return "n/a"
    from kronos_tune.backtest.significance import format_p

    return f"{test.t:.{digits}f}, p {format_p(test.p)}"


def _interval_cell(test) -> str:
    if test is None:
        return "-"
    if test.low is None:
        return f"{_num(test.mean, 3)} [n/a]"
    return f"{_num(test.mean, 3)} [{test.low:.3f}, {test.high:.3f}]"


def _ratio_cell(skill) -> str:
    if skill is None:
        return "-"
    dm = skill.mae_vs_persistence
    from kronos_tune.backtest.significance import format_p

    return f"{_num(skill.mae_ratio, 3)} (p {format_p(dm.p)})" if dm.reason is None else f"{_num(skill.mae_ratio, 3)}"


def _sharpe_cell(h: dict) -> str:
    if not math.isfinite(h.get("sharpe_low", math.nan)):
        return _num(h["sharpe"], 2)
    return f"{_num(h['sharpe'], 2)} [{h['sharpe_low']:.1f}, {h['sharpe_high']:.1f}]"


def _columns(result: BacktestResult) -> tuple[list[str], list[dict]]:
    """Column titles and one dict of figures per column: each setting, then persistence and drift. A setting with
    random weights says so under its title; so does drift on synthetic data, whose trends are planted."""
    from kronos_tune.backtest.outputs import headline

    titles = [title if result.caveat(scores.setting) is None else f"{title}\n{result.caveat(scores.setting)}"
              for title, scores in zip(result.config.titles([s.setting for s in result.scores]), result.scores)]
    columns = [{**headline(s), "skill": s.skill, "band": None if s.calibration is None else s.calibration.overall}
               for s in result.scores]
    if result.naive is not None:
        naive = result.naive
        titles += ["persistence", "drift\nsynthetic: planted trends" if result.synthetic else "drift"]
        columns += [{"mae_return": naive.drift_skill.persistence_mae,
                     "band": None if naive.band is None else naive.band.overall},
                    {**headline(naive.drift), "skill": naive.drift_skill}]
    return titles, columns


def _cell(render):
    """A row's renderer that answers '-' for a figure a column does not have (persistence has no IC)."""
    def cell(h: dict) -> str:
        try:
            return render(h)
        except KeyError:
            return "-"
    return cell


def _annualized(name: str, periods: int) -> str:
    """A row's name, saying so when its figure annualizes fewer than FEW_PERIODS rebalances."""
    from kronos_tune.backtest.portfolio import FEW_PERIODS

    return name if periods >= FEW_PERIODS else f"{name} ({periods} periods: extrapolated)"


def results_table(result: BacktestResult) -> Table:
    from kronos_tune.backtest.outputs import caveats

    title = f"backtest: {result.counted()}"
    if result.overlap.origins_in_span:
        title += f" ({result.overlap.origins_in_span} IN-SAMPLE, --allow-overlap)"
    notes = caveats(result)
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="\n".join(notes) if notes else None, caption_justify="left")
    periods = result.scores[0].curve.periods
    table.add_column("score")
    titles, columns = _columns(result)
    if result.naive is not None and result.naive.band is not None:
        titles[len(result.scores)] = "persistence (random-walk band)"
    for name in titles:
        table.add_column(name, justify="right")
    lag = "" if result.naive is None else f" (lag {result.naive.lag})"
    rows = [("IC mean (std, t)", lambda h: f"{_num(h['ic_mean'])} ({_num(h['ic_std'])}, {_num(h['ic_t'], 2)})"),
            (f"IC: HAC t, p{lag}", lambda h: _test(h["skill"].ic)),
            ("RankIC mean (std, t)",
             lambda h: f"{_num(h['rank_ic_mean'])} ({_num(h['rank_ic_std'])}, {_num(h['rank_ic_t'], 2)})"),
            (f"RankIC: HAC t, p{lag}", lambda h: _test(h["skill"].rank_ic)),
            ("ICIR / RankICIR", lambda h: f"{_num(h['icir'], 3)} / {_num(h['rank_icir'], 3)}"),
            ("hit rate", lambda h: _num(h["hit_rate"], 3)),
            ("hit rate per origin [95 %]", lambda h: _interval_cell(h["skill"].hit_rate)),
            ("MAE of returns", lambda h: _num(h["mae_return"], 5)),
            ("MAE / persistence (DM p)", lambda h: _ratio_cell(h["skill"])),
            ("cumulative return, after costs", lambda h: _pct(h["cumulative_return"])),
            (_annualized("annualized return", periods), lambda h: _pct(h["annualized_return"])),
            (_annualized("annualized volatility", periods),
             lambda h: _pct(h["annualized_volatility"], signed=False)),
            (_annualized("Sharpe [95 %]", periods), _sharpe_cell),
            ("max drawdown", lambda h: _pct(h["max_drawdown"], signed=False)),
            ("turnover / rebalance", lambda h: _num(h["turnover"], 3)),
            ("equal-weight universe", lambda h: _pct(h["benchmark_cumulative_return"]))]
    if result.naive is None:
        rows = [r for r in rows if "HAC" not in r[0] and "persistence" not in r[0] and "[95" not in r[0]]
    for name, render in rows:
        table.add_row(name, *(_cell(render)(h) for h in columns))
    if result.agreement is not None:
        table.add_row("ranking agreement (Spearman)", "", _num(result.agreement.spearman.mean),
                      *([""] * (len(columns) - 2)))
    bands = [h.get("band") for h in columns]
    if any(band is not None for band in bands):  # the random-walk band's figures even without sample paths
        for name, render in BAND_ROWS:
            table.add_row(name, *("-" if band is None else render(band) for band in bands))
        if result.naive is not None:
            skills = ["-" if s.skill is None else "needs --sample-count 2+" if s.calibration is None
                      else _num(s.skill.crps_skill, 3) for s in result.scores]
            table.add_row("CRPS skill vs random-walk band", *skills, "(reference)", "-")
    return table


def verdict_lines(result: BacktestResult) -> list[str]:
    """Each setting against persistence, then (with --compare) B against A, one line each."""
    from kronos_tune.backtest.scoring import with_caveat

    titles = result.config.titles([scores.setting for scores in result.scores])
    lines = [with_caveat(scores.skill.verdict(title), result.caveat(scores.setting))
             for scores, title in zip(result.scores, titles) if scores.skill is not None]
    if result.comparison is not None:
        lines.append(with_caveat(result.comparison.verdict(), result.comparison_caveat()))
    return lines


def agreement_line(result: BacktestResult) -> str | None:
    if result.agreement is None:
        return None
    a, b = result.scores
    agreement = result.agreement
    title_a, title_b = result.config.titles([a.setting, b.setting])
    return (f"ranking agreement {title_b} vs {title_a}: Spearman of predicted returns "
            f"mean {_num(agreement.spearman.mean)} (std {_num(agreement.spearman.std)}, min "
            f"{_num(agreement.spearman_min)}, max {_num(agreement.spearman_max)}, {agreement.spearman.n} origins); "
            f"IC diff {_num(b.ic.mean - a.ic.mean)}, RankIC diff {_num(b.rank_ic.mean - a.rank_ic.mean)}, "
            f"cumulative return diff {_pct(b.curve.cumulative_return - a.curve.cumulative_return)}")


def interrupted_text(folder: Path | None) -> str:
    """What an interrupted backtest kept, and the command that continues it (`folder`: None before the run
    folder was claimed)."""
    if folder is None:
        return "before the run folder was made, nothing is kept; run the same command again"
    from kronos_tune.resume_command import resume_line

    return f"the finished chunks are kept in {folder}; resume with: {resume_line('backtest', folder, [])}"


class BacktestProgress(LiveProgress):
    """A Rich bar over symbol-origins with symbols/s; one task per prediction setting."""

    label, unit = "backtest", "symbol-origins"

    def __init__(self, console: Console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("[bold]backtest[/] {task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("symbol-origins"),
                                 TextColumn("origins {task.fields[origins]}"),
                                 TextColumn("{task.fields[rate]} symbols/s"), TimeElapsedColumn(),
                                 TextColumn("{task.fields[left]}"), console=console, transient=False)
        self.tasks: dict[str, int] = {}

    def update(self, state: Progress) -> None:
        if state.setting not in self.tasks:  # the resumed ones as its start: the rate is this invocation's
            self.tasks[state.setting] = self.progress.add_task(state.setting, total=state.total,
                                                               completed=state.resumed, origins="", rate="",
                                                               left="", left_s=None, rate_per_s=None)
        left = state.seconds_left
        rate = state.symbols_per_s or None
        self.progress.update(self.tasks[state.setting], completed=state.predicted,
                             origins=f"{state.origins_done}/{state.origins_total}",
                             rate="-" if rate is None else f"{rate:,.1f}",
                             left="" if left is None else f"{format_duration(left)} left", left_s=left,
                             rate_per_s=rate)


def backtest_command(
    lookback: Annotated[int, typer.Option("--lookback", help="History bars each prediction sees.")],
    pred_len: Annotated[int, typer.Option("--pred-len", help="Bars predicted at each origin (the horizon).")],
    checkpoint: CheckpointOption = None,
    size: SizeOption = None,
    tokenizer: Annotated[Optional[Path], typer.Option(
        "--tokenizer", help="Tokenizer folder or hub id (NeoQuasar/Kronos-Tokenizer-base).")] = None,
    data: Annotated[Optional[list[Path]], typer.Option(
        "--data", help="A folder of per-symbol .csv/.parquet files, or one panel file with a symbol column.")] = None,
    symbol_column: Annotated[Optional[str], typer.Option(
        "--symbol-column", help="--data files are panels; this column names each symbol (default: a column "
                                "named symbol, ticker, code, instrument or stock).")] = None,
    date_format: DateFormatOption = None,
    synthetic: Annotated[Optional[int], typer.Option(
        "--synthetic", help="A synthetic universe of N symbols (market + sector factors) instead of files.")] = None,
    origins: Annotated[Optional[int], typer.Option(
        "--origins", help="Number of origins, the latest ones (default: all the data holds; 20 with --synthetic).")
    ] = None,
    every: Annotated[Optional[str], typer.Option(
        "--every", help="Bars between origins, or 'day' (default: --pred-len, holding periods do not overlap).")
    ] = None,
    top_k: Annotated[int, typer.Option("--top-k", help="Symbols in each leg of the portfolio.")] = 10,
    cost_bps: Annotated[float, typer.Option("--cost-bps", help="Transaction cost per unit of turnover, bps.")] = 10.0,
    long_only: Annotated[bool, typer.Option(
        "--long-only", help="Long the top-k only, against the equal-weight universe (default: long-short).")] = False,
    chunk_series: Annotated[Optional[int], typer.Option(
        "--chunk-series", help=f"Symbol-origins per chunk, the unit kept as it finishes and shared between "
                               f"processes; default {HOW_CHOSEN}.")] = None,
    nproc: Annotated[int, typer.Option(
        "--nproc", help="Processes predicting (one per GPU); >1 runs torchrun ranks that claim chunks by speed.")
    ] = 1,
    max_restarts: Annotated[int, typer.Option(
        "--max-restarts", help="With --nproc: torchrun restarts a failed group this many times; it continues from "
                               "the finished chunks.")] = 0,
    nnodes: NnodesOption = None,
    node_rank: NodeRankOption = None,
    rdzv_endpoint: RdzvEndpointOption = None,
    rdzv_id: RdzvIdOption = None,
    rdzv_backend: RdzvBackendOption = None,
    device: DeviceOption = "auto",
    amp: AmpOption = "none",
    window_mode: WindowModeOption = "refill",
    max_context: Annotated[Optional[int], typer.Option(
        "--max-context", help="Tokens the predictor sees; default the size's context (512 for checkpoints).")
    ] = None,
    sample_count: SampleCountOption = 1,
    temperature: TemperatureOption = 1.0,
    top_p: TopPOption = 0.9,
    sample_top_k: Annotated[int, typer.Option(
        "--sample-top-k", help="Top-k sampling of tokens (0 off, 1 greedy); --top-k is the portfolio's.")] = 0,
    compare: Annotated[Optional[str], typer.Option(
        "--compare", help="A second setting on the same origins, e.g. shift, bf16, sample-count=10, "
                          "'window-mode=shift,max-context=256', or another model: checkpoint=DIR[,tokenizer=DIR] "
                          "(a training run's folder works).")] = None,
    allow_overlap: Annotated[bool, typer.Option(
        "--allow-overlap", help="Also score origins inside a checkpoint's training span (data_span.json); the "
                                "report marks them in-sample.")] = False,
    periods_per_year: Annotated[Optional[float], typer.Option(
        "--periods-per-year", help="Rebalances per year for annualizing (default: 252 trading days x bars/day "
                                   "/ --every).")] = None,
    seed: SeedOption = 0,
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="Run folder (default runs/backtest/<model>-<data>-<time>/).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run in --out; finished chunks are kept.")
                      ] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the kronos-tune run in --out.")] = False,
    calendar: CalendarOption = None,
    offline: OfflineOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="No progress bar; print backtest.json.")] = False,
) -> None:
    """Predict every symbol at rolling origins and score the ranking: IC, RankIC, hit rate, a top-k portfolio."""
    from kronos_tune.backtest.config import BacktestConfig, PredictionSetting, parse_setting
    from kronos_tune.predict.config import check_data_paths

    console = make_console(stderr=as_json)

    def on_note(level: str, message: str) -> None:
        console.print(Text.assemble((f"{level}:", "yellow" if level == "warning" else "cyan"), " ", message),
                      soft_wrap=True)

    setting = PredictionSetting(window_mode=window_mode, amp=amp, sample_count=sample_count, temperature=temperature,
                                top_p=top_p, sample_top_k=sample_top_k, max_context=max_context)
    config = BacktestConfig(
        lookback=lookback, pred_len=pred_len, size=size, checkpoint=checkpoint, tokenizer=tokenizer,
        data=tuple(data or ()), synthetic=synthetic, origins=origins, every=every, top_k=top_k, cost_bps=cost_bps,
        long_only=long_only, chunk_series=chunk_series, nproc=nproc, max_restarts=max_restarts, nnodes=nnodes,
        node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, rdzv_backend=rdzv_backend, device=device,
        setting=setting,
        compare=None if compare is None else parse_setting(compare, setting), seed=seed,
        periods_per_year=periods_per_year, out=out, resume=resume, overwrite=overwrite, calendar=calendar,
        offline=offline, symbol_column=symbol_column, allow_overlap=allow_overlap, date_format=date_format)
    check_data_paths(config)  # a missing --data path: one line before torch loads
    from kronos_tune.backtest.outputs import JSON_NAME
    from kronos_tune.backtest.runner import run_backtest

    from kronos_core.signals import interrupt_on_signals, stop_signal_name

    try:
        with interrupt_on_signals():  # SIGTERM and SIGHUP (a closed terminal) stop it as Ctrl-C does
            if as_json:
                result = run_backtest(config, on_note=on_note)
            else:
                with BacktestProgress(console) as view:
                    result = run_backtest(config, on_note=on_note, on_progress=view.update)
    except KeyboardInterrupt as error:
        stopped_by = stop_signal_name()
        console.print(f"{'interrupted' if stopped_by is None else 'stopped by ' + stopped_by}: "
                      f"{interrupted_text(getattr(error, 'folder', None))}",
                      markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(130 if stopped_by is None else 128 + signal.Signals[stopped_by].value) from None

    if result is None:  # --nnodes: another node scores the run (runner.run_backtest)
        console.print(f"backtest: this node's ranks are done; the node that ran the last rank 0 scores the run in "
                      f"{config.out}",
                      markup=False, highlight=False, soft_wrap=True)
        return
    if as_json:
        typer.echo((result.run_path / JSON_NAME).read_text(encoding="utf-8").strip())
        return
    console.print(results_table(result))
    for line in (*verdict_lines(result), agreement_line(result), result.overlap.marking()):
        if line is not None:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    rate = result.symbol_origins_per_s
    console.print(f"predicted {result.session_predicted} symbol-origins in {result.session_predict_seconds:.1f} s"
                  + (f" ({rate:,.2f} symbols x origins per s)" if rate is not None else " (all were saved already)")
                  + f"; results in {result.run_path}" + ("" if result.plot else " (no picture)"),
                  markup=False, highlight=False, soft_wrap=True)
    precision = result.precision_verdict()
    if precision is not None:
        console.print(precision, markup=False, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add the `backtest` command to the root app."""
    app.command("backtest")(backtest_command)


__all__ = ["agreement_line", "backtest_command", "register", "results_table", "verdict_lines"]
