"""Datasets and loaders for training: one global batch per optimizer step, sliced by rank.

Item ``idx`` of epoch ``e`` is a pure function of (seed, e, idx) (see
kronos_core.data.dataset), so the sampler only has to hand every rank the right
indices: micro-batch ``m`` of optimizer step ``s`` covers global items
``[g*B*W, (g+1)*B*W)`` with ``g = s*A + m``, and rank ``r`` reads the ``r``-th
slice of ``B`` of them. One process with batch ``B*W`` therefore reads the
same windows per micro-step as ``W`` processes with batch ``B``. The sampler
yields ``(epoch, idx)`` pairs so DataLoader workers (persistent or not) never
need ``set_epoch`` to reach them, and it starts at any step for an exact resume.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_ready

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from kronos_core.data.kline import FEATURE_COLUMNS, TIME_COLUMN
from kronos_core.data.dataset import KlineEvalDataset, KlineWindowDataset, split_frames
from kronos_core.deferred import deferred
from kronos_core.errors import KronosError, KronosWarning
from kronos_core.data.series import KlineSeries, SeriesSource, load_series
from kronos_core.train.config import TrainConfig
from kronos_core.train.data_span import DataSpan, cut_frames
from kronos_core.signals import STOP_SIGNALS

pd = deferred("pandas")  # imported at its first use (kronos_core.deferred)


def load_training_data(config: TrainConfig) -> tuple[list[pd.DataFrame], DataSpan]:
    """The training series (kronos_core.data.series: synthetic ones, one per file, or one per symbol of panel
    files, `symbol_column`) as K-line frames, cut at `train_until` (whole without it), and the span they cover
    (kronos_core.train.data_span). What reading did to a file (columns ignored, stamps converted, ...) and what
    it found suspicious are each one KronosWarning line."""
    loaded = load_series(() if config.is_synthetic else config.data, _say, symbol_column=config.symbol_column,
                         date_format=config.date_format, synthetic=config.synthetic_series,
                         rows=config.synthetic_rows, seed=config.seed)
    frames = [_frame(series, loaded) for series in loaded.all()]
    return cut_frames(frames, config.train_until, loaded.paths, config.is_synthetic, config.symbol_column,
                      config.val_fraction)


@dataclass(frozen=True)
class WindowCount:
    """How many windows of `window_length` rows a config's data holds on each side of the trainer's split: every
    start position in each series' training / validation part."""

    train: int
    val: int
    window_length: int


def count_windows(config: TrainConfig) -> WindowCount:
    """Read the config's data (cut at train_until) and count the windows on each side of the split; reading's
    notes are left to the trainer, which says them once."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KronosWarning)
        frames, _ = load_training_data(config)
    length = config.window_length
    train, val = split_frames(frames, config.val_fraction, min_val_rows=length)
    return WindowCount(sum(max(0, len(part) - length + 1) for part in train),
                       sum(max(0, len(part) - length + 1) for part in val), length)


def _frame(series: KlineSeries, loaded: SeriesSource) -> pd.DataFrame:
    frame = pd.DataFrame({TIME_COLUMN: series.index(), **dict(zip(FEATURE_COLUMNS, series.features.T))})
    if not loaded.synthetic:  # a synthetic series is "series k" in messages
        frame.attrs["source"] = series.source
    if loaded.name_column is not None:
        frame.attrs["symbol"] = series.name
    return frame


def _say(level: str, message: str) -> None:
    warnings.warn(message, KronosWarning, stacklevel=2)


def _short_symbols_line(short: list[str], frames: list[pd.DataFrame], config: TrainConfig) -> str:
    """The symbols left out, counted the way data_span.json counts: of `series`, those with no bar up to the
    cut (not in `series_used`), then those read but too short; and how many train."""
    shown = ", ".join(map(str, short[:5])) + (f" and {len(short) - 5} more" if len(short) > 5 else "")
    read = sum(1 for frame in frames if len(frame))
    why = (f"{len(short) - (len(frames) - read)} of the {read} read have fewer than {config.window_length} rows "
           f"(lookback_window + predict_window + 1) before the last val_fraction")
    if read < len(frames):
        why = f"{len(frames) - read} have no bar up to train_until; {why}"
    what = "symbols" if config.symbol_column is not None else "series"
    return (f"{len(short)} of {len(frames)} {what} are too short for a training window and are left out ({why}): "
            f"{shown}; {len(frames) - len(short)} {what} train")


def check_validation_split(config: TrainConfig, frames: list[pd.DataFrame]) -> None:
    """One line when series long enough for a window are too short to keep one on each side of the split
    (a window each for training and validation needs twice its rows): what to change, before any folder."""
    longest = max((len(frame) for frame in frames), default=0)
    if not config.window_length <= longest < 2 * config.window_length:
        return
    _, val = split_frames(frames, config.val_fraction, min_val_rows=config.window_length)
    if any(len(part) >= config.window_length for part in val):
        return
    raise KronosError(
        f"validation split: the last val_fraction {config.val_fraction:g} of each series holds no window of "
        f"{config.window_length} rows (lookback_window {config.lookback_window} + predict_window "
        f"{config.predict_window} + 1); the longest series has {longest} rows, and a series gets a whole "
        f"validation window only from {2 * config.window_length} rows; use a shorter lookback_window in "
        f"--config (e.g. 60), a later --train-until, or more data")


def build_datasets(config: TrainConfig, frames: list[pd.DataFrame] | None = None,
                   ) -> tuple[KlineWindowDataset, KlineEvalDataset]:
    """Split every series in time (last `val_fraction` validates) and build both datasets; `frames`: the
    series to use (default: `load_training_data`, cut at `train_until`)."""
    if frames is None:
        frames, _ = load_training_data(config)
    train, val = split_frames(frames, config.val_fraction, min_val_rows=config.window_length)
    short = [frame.attrs.get("symbol") or frame.attrs.get("source") or f"series {k}"
             for k, (frame, part) in enumerate(zip(frames, train)) if len(part) < config.window_length]
    if short:
        _say("warning", _short_symbols_line(short, frames, config))
    common = dict(lookback=config.lookback_window, predict_window=config.predict_window, clip=config.clip,
                  preload=config.preload)
    train_set = KlineWindowDataset(train, samples_per_epoch=config.samples_per_epoch, seed=config.seed, **common)
    try:
        val_set = KlineEvalDataset(val, max_windows=config.eval_samples, **common)
    except KronosError as error:
        check_validation_split(config, frames)
        raise KronosError(f"validation split: {error}; raise val_fraction or give longer series") from None
    return train_set, val_set


class EpochItems(Dataset):
    """Index with ``(epoch, idx)``: selects the epoch's draw, then returns the item."""

    def __init__(self, dataset: KlineWindowDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, idx = key
        if self.dataset.epoch != epoch:
            self.dataset.set_epoch(epoch)
        return self.dataset[idx]


class GlobalBatchSampler(Sampler[list[tuple[int, int]]]):
    """Micro-batches of ``(epoch, idx)`` for one rank, from optimizer step ``start_step`` on, endlessly."""

    def __init__(self, samples_per_epoch: int, batch_size: int, accumulation_steps: int, world_size: int,
                 rank: int, start_step: int = 0) -> None:
        self.batch_size = batch_size
        self.accumulation_steps = accumulation_steps
        self.world_size = world_size
        self.rank = rank
        self.start_step = start_step
        self.global_batch = batch_size * accumulation_steps * world_size
        self.steps_per_epoch = samples_per_epoch // self.global_batch
        if self.steps_per_epoch < 1:
            raise KronosError(f"samples_per_epoch={samples_per_epoch} is less than one optimizer step's global batch "
                              f"(batch_size {batch_size} x accumulation_steps {accumulation_steps} x "
                              f"{world_size} processes = {self.global_batch}); raise samples_per_epoch")

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, step within epoch) of global optimizer step ``step`` (0-based)."""
        return divmod(step, self.steps_per_epoch)

    def micro_batch(self, step: int, micro: int) -> list[tuple[int, int]]:
        epoch, in_epoch = self.position(step)
        group = in_epoch * self.accumulation_steps + micro
        first = group * self.batch_size * self.world_size + self.rank * self.batch_size
        return [(epoch, first + i) for i in range(self.batch_size)]

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        step = self.start_step
        while True:
            for micro in range(self.accumulation_steps):
                yield self.micro_batch(step, micro)
            step += 1


def _stack(items: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    xs, stamps = zip(*items)
    return torch.stack(xs), torch.stack(stamps)


def worker_context(config: TrainConfig) -> str | None:
    """How loader workers start. With torch.compile the process has compile threads (and, on CUDA, driver
    threads) by the time the evaluation loader starts its workers; forking such a process can leave a child
    holding a lock no thread will release (the child hangs, and the parent waits on it forever). Workers then
    start from a forkserver, a clean process. Without compile, the platform's default (fork on Linux)."""
    if config.num_workers > 0 and config.compile != "off" and "forkserver" in mp.get_all_start_methods():
        return "forkserver"
    return None


FORKSERVER_PRELOAD = "kronos_core.train.forkserver_preload"


def _start_context(config: TrainConfig) -> str | None:
    """`worker_context`, with the forkserver (when it is the one) made deaf to SIGINT and SIGTERM before it
    starts: its workers are its children and exit with it (see kronos_core.train.forkserver_preload). The
    module joins the server's preload list (``__main__`` by default), so only that process imports it. It is
    process-wide: every forkserver child of this process starts ignoring both (only the loaders use one
    here); a forkserver already running is left as it is."""
    context = worker_context(config)
    if context == "forkserver":
        from multiprocessing import forkserver

        preload = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))
        if FORKSERVER_PRELOAD not in preload:
            forkserver.set_forkserver_preload([*preload, FORKSERVER_PRELOAD])
    return context


def init_worker(worker_id: int) -> None:
    """Every loader's ``worker_init_fn``: the worker ignores SIGINT, SIGTERM and SIGHUP (the main process
    alone decides; a closed terminal hangs up the whole job) and exits when the main process is gone.

    A terminal's Ctrl-C reaches the whole foreground process group, and launchers (``kill -- -PGID``, a
    batch scheduler's signal to every process of the job) reach the workers too. torch's handler kills a
    worker on a SIGTERM from anyone but its parent, and a worker with Python's default SIGINT handler (one
    started from the forkserver) ends its loop quietly on KeyboardInterrupt; either way the main process's
    next batch raises "DataLoader worker ... killed by signal" / "exited unexpectedly" before the step
    boundary where ``stop_on_signals`` would save. Ignoring both, workers serve batches until the main
    process shuts them down (`close_loader`). torch's last-resort ``terminate()`` is a SIGTERM and now does
    nothing, so `close_loader` kills a worker that outlives its shutdown.

    If the main process dies instead, torch's worker loop only notices its own parent changing (between
    batches, at least every 5 s): enough for forked workers, never for a forkserver's, whose parent is the
    server, which in turn waits for them (they hold its "alive" pipe). So a thread watches the worker's
    parent sentinel (a pipe whose write end the main process holds; forked siblings started later hold
    copies and go first) and ends the worker when it closes."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    parent = mp.parent_process()
    if parent is not None and parent.sentinel is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), name="exit-with-main", daemon=True).start()


def _exit_with(sentinel: int) -> None:
    wait_ready([sentinel])
    os._exit(0)


def close_loader(loader: DataLoader) -> None:
    """Shut down the loader's persistent workers now, not at garbage collection or interpreter exit: torch's
    own shutdown (done event, ``None`` to every worker, a join of a few seconds each), then SIGKILL for a
    worker still alive (stuck in a read: it ignores torch's SIGTERM, see `init_worker`). Nothing to
    do without workers or before the first ``iter()``; a later ``iter()`` starts new workers."""
    iterator = getattr(loader, "_iterator", None)
    loader._iterator = None
    if iterator is None or not hasattr(iterator, "_shutdown_workers"):
        return
    iterator._shutdown_workers()
    for worker in getattr(iterator, "_workers", ()):
        if worker.is_alive():
            worker.kill()
            worker.join(timeout=5.0)


def train_loader(dataset: KlineWindowDataset, config: TrainConfig, sampler: GlobalBatchSampler) -> DataLoader:
    workers = config.num_workers
    return DataLoader(
        EpochItems(dataset), batch_sampler=sampler, num_workers=workers, collate_fn=_stack,
        pin_memory=config.pin_memory, persistent_workers=workers > 0, prefetch_factor=2 if workers else None,
        # Our own generator: creating an iterator must not draw from the global RNG (exact resume).
        generator=torch.Generator().manual_seed(config.seed), multiprocessing_context=_start_context(config),
        worker_init_fn=init_worker if workers else None,
    )


def eval_loader(dataset: KlineEvalDataset, config: TrainConfig, world_size: int, rank: int) -> DataLoader:
    """Rank r evaluates windows r, r+W, r+2W, ...; sums are reduced across ranks afterwards."""
    indices = list(range(rank, len(dataset), world_size))
    batches = [indices[i:i + config.batch_size] for i in range(0, len(indices), config.batch_size)]
    workers = config.num_workers
    return DataLoader(dataset, batch_sampler=batches, num_workers=workers, collate_fn=_stack,
                      pin_memory=config.pin_memory, persistent_workers=workers > 0,
                      generator=torch.Generator().manual_seed(config.seed),
                      multiprocessing_context=_start_context(config),
                      worker_init_fn=init_worker if workers else None)
