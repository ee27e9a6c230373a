"""`kronos-tune predict`: forecast K-line series from files or synthetic data, optionally scored on a holdout."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from kronos_core.units import format_bytes, format_duration
from kronos_tune.commands.common import (AmpOption, CalendarOption, CheckpointOption, DateFormatOption,
                                         DeviceOption, NnodesOption, NodeRankOption, OfflineOption,
                                         RdzvBackendOption, RdzvEndpointOption, RdzvIdOption, SampleCountOption,
                                         SeedOption, SizeOption, TemperatureOption, TopPOption, WindowModeOption,
                                         make_console)
from kronos_tune.commands.progress_lines import ProgressLines, lines_when_piped
from kronos_tune.predict.chunk_size import HOW_CHOSEN
from kronos_tune.time_left import TimeLeft, seconds_left

try:  # typer >= 0.2x carries its own copy of click (as kronos_tune.cli)
    from typer._click.core import ParameterSource
    from typer._click.exceptions import MissingParameter
except ImportError:  # pragma: no cover - older typer on click
    from click.core import ParameterSource  # type: ignore[no-redef]
    from click.exceptions import MissingParameter  # type: ignore[no-redef]

if TYPE_CHECKING:  # the job imports torch; load it only when the command runs
    from kronos_tune.predict.job import PredictResult
    from kronos_tune.predict.large import JobProgress

TABLE_ROWS = 20


def _price(value: float) -> str:
    return f"{value:.4f}" if abs(value) < 1e5 else f"{value:,.0f}"


def _compact(value: float) -> str:
    """Volume and amount in a preview: three significant digits and K/M/B (the --out file has every digit)."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _preview_columns(frame_columns: list[str]) -> list[str]:
    """The mean columns and the close's quantiles (every column's are in the --out file)."""
    from kronos_tune.predict.quantiles import base_column

    return [c for c in frame_columns if base_column(c) == c or base_column(c) == "close"]


def _predictions_table(result: PredictResult) -> Table:
    from kronos_tune.predict.quantiles import base_column

    frame = result.frames[0]
    frame = frame[_preview_columns(list(frame.columns))]
    shown = frame.iloc[:TABLE_ROWS]
    caption = None if len(frame) <= TABLE_ROWS else f"first {TABLE_ROWS} of {len(frame)} rows"
    table = Table(title=f"predictions: {result.series_names[0]}", title_justify="left", caption=caption,
                  caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("timestamps", no_wrap=True)
    for column in frame.columns:
        table.add_column(column, justify="right", no_wrap=True)
    for stamp, row in shown.iterrows():
        cells = [_price(row[c]) if base_column(c) in ("open", "high", "low", "close") else _compact(row[c])
                 for c in frame.columns]
        table.add_row(str(stamp), *cells)
    return table


def _scores_table(result: PredictResult) -> Table:
    table = Table(title="holdout: predicted close vs actual", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    table.add_column("series", no_wrap=True)
    table.add_column("MAE", justify="right")
    table.add_column("MAPE", justify="right")
    table.add_column("MAE of persistence", justify="right")
    for item in result.scores or []:
        table.add_row(item.series, f"{item.mae:.6g}", f"{item.mape:.3f} %", f"{item.persistence_mae:.6g}")
    table.add_section()
    table.add_row("mean", f"{result.mean_mae:.6g}", f"{result.mean_mape:.3f} %", f"{result.mean_persistence_mae:.6g}",
                  style="bold")
    return table


def _json_ready(report: dict) -> dict:
    """Non-finite floats become null so the object stays valid JSON."""
    return {key: (None if isinstance(value, float) and not math.isfinite(value) else value)
            for key, value in report.items()}


class _JobBar:
    """The bar of a prediction job (kronos_tune reports chunks, the command draws them): series finished
    (resumed ones included), series/s, time left, and per rank; shown from the first report until the job
    returns, then cleared."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.lines: ProgressLines | None = None  # the piped-output lines, once the bar has started
        self.estimate = TimeLeft()  # from the job's start: "first estimate X, actual Y" at its end

    def close(self) -> None:
        # a signal may land between the bar's start and its lines' (then only what started is stopped)
        if self.lines is not None:
            self.lines.stop()
        if self.progress is not None:
            self.progress.stop()

    def job(self, report: JobProgress) -> None:
        if self.progress is None:
            columns = (TextColumn("[bold]predict"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("{task.fields[rate]}"))
            self.progress = Progress(*columns, console=self.console, transient=True)
            self.task = self.progress.add_task("", total=report.series_total, completed=report.series_resumed,
                                               rate="", left_s=None, rate_per_s=None)
            self.progress.start()
            self.lines = lines_when_piped(self.progress, "predict", "series")
            self.lines.start()
        assert self.task is not None
        done = report.series_done - report.series_resumed  # this invocation's: resumed chunks took none of its time
        eta = self.estimate.expect(seconds_left(done, report.seconds, report.series_total - report.series_done))
        rate = f"{report.series_per_s:.1f} series/s" + ("" if eta is None else f", {format_duration(eta)} left")
        if len(report.ranks) > 1:
            rate += " (" + ", ".join(f"rank {rank}: {series / seconds if seconds else 0:.1f}/s"
                                     for rank, (series, seconds) in sorted(report.ranks.items())) + ")"
        self.progress.update(self.task, total=report.series_total, completed=report.series_done, rate=rate,
                             left_s=eta, rate_per_s=report.series_per_s or None)


def predict_command(
    ctx: typer.Context,
    lookback: Annotated[Optional[int], typer.Option(
        "--lookback", help="History rows per series (the last N rows); required unless --config sets it.")] = None,
    pred_len: Annotated[Optional[int], typer.Option(
        "--pred-len", help="Future steps to predict; required unless --config sets it.")] = None,
    config_file: Annotated[Optional[Path], typer.Option(
        "--config", metavar="FILE", dir_okay=False, help="A prediction config (a \\[predict] table, e.g. the "
        "recommended.toml of `kronos-tune benchmark --task predict`); flags given here win over it.")] = None,
    checkpoint: CheckpointOption = None,
    size: SizeOption = None,
    tokenizer: Annotated[Optional[Path], typer.Option(
        "--tokenizer", help="Tokenizer folder or hub id (NeoQuasar/Kronos-Tokenizer-base); default with --size: "
                            "that size's random tokenizer.")] = None,
    data: Annotated[Optional[list[Path]], typer.Option(
        "--data", help="A .csv/.parquet file (one series each; repeatable) or a folder of them.")] = None,
    synthetic: Annotated[Optional[int], typer.Option(
        "--synthetic", help="Predict N synthetic A-share series instead of files (default without --data: 4).")] = None,
    sample_count: SampleCountOption = 1,
    quantiles: Annotated[Optional[str], typer.Option(
        "--quantiles", help="Also write per-bar quantiles of the sample paths, e.g. 0.1,0.5,0.9 -> close_q10, "
                            "close_q50, close_q90 (each column); needs --sample-count >= 2.")] = None,
    temperature: TemperatureOption = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", help="Top-k sampling (0 off, 1 greedy).")] = 0,
    top_p: TopPOption = 0.9,
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="Write every prediction, long format, to FILE.csv or FILE.parquet.")] = None,
    device: DeviceOption = "auto",
    amp: AmpOption = "none",
    weight_dtype: Annotated[str, typer.Option(
        "--weight-dtype", help="fp32, or bf16: hold the weights in bf16 and run under bf16 autocast (half the "
                               "weight bytes per decode step).")] = "fp32",
    max_batch_size: Annotated[Optional[int], typer.Option(
        "--max-batch-size", help="Sequences (series x samples) at once; default from free memory.")] = None,
    max_context: Annotated[Optional[int], typer.Option(
        "--max-context", help="Tokens the predictor sees; default 512 (2048 with --size mini).")] = None,
    seed: SeedOption = 0,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue the --out job that was interrupted (its work folder beside --out keeps the "
                         "finished chunks); the same data, model and settings.")] = False,
    chunk_series: Annotated[Optional[int], typer.Option(
        "--chunk-series", help=f"Series per chunk of a --out job (kept as each finishes); default {HOW_CHOSEN}.")] = None,
    max_restarts: Annotated[int, typer.Option(
        "--max-restarts", help="torchrun: restart the ranks this many times after a failure (they continue from "
                               "the finished chunks).")] = 0,
    runner: Annotated[str, typer.Option(
        "--runner", help="Who predicts the chunks: torchrun (this process, or torchrun's ranks with --nproc/--nnodes) "
                         "or ray (Ray Data actors; pip install \"kronos-tune[ray]\").")] = "torchrun",
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray-address", help="--runner ray: the cluster, HOST:PORT of its head, ray://HOST:PORT, auto or local "
                              "(default: $RAY_ADDRESS, else a Ray started on this machine).")] = None,
    ray_actors: Annotated[Optional[int], typer.Option(
        "--ray-actors", help="--runner ray: actors in the pool, one GPU (CUDA) or CPU each (default: one per GPU or "
                             "CPU of the cluster).")] = None,
    holdout: Annotated[bool, typer.Option(
        "--holdout", help="Hold out the last --pred-len rows of each series and report MAE/MAPE of close.")] = False,
    symbol_column: Annotated[Optional[str], typer.Option(
        "--symbol-column", help="--data files are panels (one long table); this column names each series.")] = None,
    date_format: DateFormatOption = None,
    window_mode: WindowModeOption = "refill",
    cuda_graphs: Annotated[Optional[bool], typer.Option(
        "--cuda-graphs/--no-cuda-graphs", help="Replay the cached one-token steps as CUDA graphs (default: on with "
        "CUDA).", show_default=False)] = None,
    kv_cache: Annotated[bool, typer.Option(
        "--kv-cache/--no-kv-cache", help="--no-kv-cache recomputes the whole window for every token (the reference "
        "method, slow).")] = True,
    nproc: Annotated[int, typer.Option(
        "--nproc", help="Processes on this node (one per GPU); >1 shards the series with torchrun.")] = 1,
    nnodes: NnodesOption = None,
    node_rank: NodeRankOption = None,
    rdzv_endpoint: RdzvEndpointOption = None,
    rdzv_id: RdzvIdOption = None,
    rdzv_backend: RdzvBackendOption = None,
    calendar: CalendarOption = None,
    offline: OfflineOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="No progress bar; print one JSON object.")] = False,
) -> None:
    """Predict the next --pred-len bars of each series; timestamps follow --calendar, or else each series' own
    bar grid."""
    from kronos_tune.checkpoints import resolve_pair
    from kronos_tune.predict.config_file import merge_predict_file, read_predict_file
    from kronos_tune.predict.config import PredictConfig, check_config
    from kronos_tune.predict.quantiles import parse_quantiles

    console = make_console()

    def on_note(level: str, message: str) -> None:
        """With --json, notes go to stderr so stdout holds the JSON object alone."""
        if as_json:
            typer.echo(f"{level}: {message}", err=True)
            return
        console.print(Text.assemble((f"{level}:", "yellow" if level == "warning" else "cyan"), " ", message),
                      soft_wrap=True)

    values = dict(
        lookback=lookback, pred_len=pred_len, size=size, checkpoint=checkpoint, tokenizer=tokenizer,
        data=tuple(data or ()), synthetic=synthetic, sample_count=sample_count, temperature=temperature,
        top_k=top_k, top_p=top_p, out=out, device=device, amp=amp, weight_dtype=weight_dtype,
        max_batch_size=max_batch_size,
        max_context=max_context, seed=seed, holdout=holdout, symbol_column=symbol_column, date_format=date_format,
        window_mode=window_mode, cuda_graphs=cuda_graphs, kv_cache=kv_cache, nproc=nproc,
        nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, rdzv_backend=rdzv_backend,
        calendar=calendar, offline=offline, quantiles=() if quantiles is None else parse_quantiles(quantiles),
        resume=resume, chunk_series=chunk_series, max_restarts=max_restarts, runner=runner,
        ray_address=ray_address, ray_actors=ray_actors,
    )
    if config_file is not None:
        values = merge_predict_file(values, given_flags(ctx), read_predict_file(config_file))
    for name in ("lookback", "pred_len"):
        if values[name] is None:
            raise MissingParameter(ctx=ctx, param=next(p for p in ctx.command.params if p.name == name))
    values["checkpoint"], values["tokenizer"] = resolve_pair(values["checkpoint"], values["tokenizer"])
    config = PredictConfig(**values)
    check_config(config)
    from kronos_tune.predict.job import run_predict  # torch: after the checks above, which need none

    bar = None if as_json else _JobBar(console)
    try:
        result = run_predict(config, on_note=on_note, on_job_progress=bar and bar.job)
    finally:
        if bar is not None:
            bar.close()

    if as_json:
        typer.echo(json.dumps(_json_ready(result.to_json_dict())))
        return
    if not result.series:  # a node whose ranks are done; the node with rank 0 writes the predictions
        return
    if result.scores is not None:
        console.print(_scores_table(result))
    if out is None:
        console.print(_predictions_table(result))
        total_rows = sum(len(frame) for frame in result.frames)
        console.print(f"not saved: pass --out FILE.csv or FILE.parquet to write all {total_rows} rows "
                      f"of {len(result.frames)} series", markup=False, highlight=False, soft_wrap=True)
    else:
        rows = result.job["rows"] if result.job else sum(len(f) for f in result.frames)
        console.print(f"wrote {rows} rows to {out}", markup=False, highlight=False, soft_wrap=True)
    console.print(
        f"{result.series} series in {result.seconds:.2f} s (predict {result.predict_seconds:.2f} s, "
        + (f"{result.series_predicted} predicted now, " if result.resumed_series else "")
        + f"{result.series_per_s:.2f} series/s) on {result.device}; "
        f"peak RSS {format_bytes(result.peak_rss_bytes, 'MiB', 1)}"
        + (f"; peak GPU {format_bytes(result.peak_gpu_bytes, 'MiB', 1)}" if result.peak_gpu_bytes is not None else ""),
        markup=False, highlight=False, soft_wrap=True,
    )
    timing = None if bar is None else bar.estimate.first_vs_actual()
    if timing is not None:
        console.print(f"time: {timing} (the first estimate came after the first chunk)", markup=False,
                      highlight=False, soft_wrap=True)


def given_flags(ctx: typer.Context) -> set[str]:
    """The parameters given on the command line (or by environment), not left at their defaults."""
    given = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, ParameterSource.PROMPT)
    return {param.name for param in ctx.command.params if param.name and ctx.get_parameter_source(param.name) in given}


def register(app: typer.Typer) -> None:
    """Add the `predict` command to the root app."""
    app.command("predict")(predict_command)
