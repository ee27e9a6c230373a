"""The training loop: one class for predictor and tokenizer, single process or torchrun (DDP or FSDP).

The loop prints nothing. Progress goes to ``callback(StepRecord)`` after every
optimizer step (loss, lr, tokens and samples per second) and to
``eval_callback(EvalRecord)`` after every evaluation; the UI (a progress bar,
metrics.jsonl, TensorBoard) lives with the caller. Memory goes to an optional
PhaseMeter. Rank 0 writes
everything under ``output_dir``::

    config.toml            the run's TrainConfig
    data_span.json         which bars it reads (files, train_until cut, first/last bar; data_span.py)
    checkpoints/last.pt    resumable state (Trainer(config, resume=output_dir)); FSDP runs keep model
                           and optimizer shards in a DCP folder beside it (sharded_checkpoint.py)
    best/                  lowest validation loss so far, published folder format, with its data_span.json
    tokenizer/             predictor runs on a random-init tokenizer: that tokenizer
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from kronos_core.errors import KronosError, one_line
from kronos_core.files import write_text_atomic
from kronos_core.hostmem import peak_rss_bytes
from kronos_core.train.builders import (
    TrainParts, build_grad_scaler, build_scheduler, build_training, check_amp_support, evaluate_sums,
    forward_backward, optimizer_step,
)
from kronos_core.train.train_state import (
    CHECKPOINT_FORMAT, capture_rng, checkpoint_path, load_checkpoint, restore_rng, save_atomic,
)
from kronos_core.train.config import TrainConfig
from kronos_core.train.distributed import DistContext
from kronos_core.train.fsdp import full_state_dict, local_norm_value, set_gradient_sync
from kronos_core.train.data_span import check_same_span, read_data_span, write_data_span
from kronos_core.train.loading import (
    GlobalBatchSampler, build_datasets, close_loader, eval_loader, load_training_data, train_loader,
)
from kronos_core.train.records import EvalRecord, PhaseClock, PhaseMeter, StepRecord, TrainSummary
from kronos_core.train.sharded_checkpoint import (
    SHARDED_KEY, load_sharded_checkpoint, load_whole_into_sharded, save_sharded_checkpoint,
)
from kronos_core.train.steps import PredictorSteps, TokenizerSteps

StepCallback = Callable[[StepRecord], None]
EvalCallback = Callable[[EvalRecord], None]


class Trainer:
    """Fine-tunes the Kronos predictor or tokenizer described by a TrainConfig.

    ``fit(max_steps)`` trains until global optimizer step ``max_steps`` (or the
    end of the schedule), evaluating and checkpointing as configured.
    ``run_steps(n)`` and ``eval_batch()`` run exactly the real training step /
    evaluation batch for tools that time or measure them.
    """

    def __init__(self, config: TrainConfig, meter: PhaseMeter | None = None,
                 callback: StepCallback | None = None, resume: str | os.PathLike | None = None,
                 eval_callback: EvalCallback | None = None) -> None:
        self.config = config
        self.meter = meter
        self.callback = callback
        self.eval_callback = eval_callback
        self.stop_requested = False
        device_type = config.resolved_device()
        self.dist = DistContext.from_env(device_type)
        try:
            self._setup(device_type, resume)
        except BaseException:
            self.dist.close()
            raise

    def _setup(self, device_type: str, resume: str | os.PathLike | None) -> None:
        config, dist = self.config, self.dist
        self.device = dist.device(device_type)
        check_amp_support(config, self.device)
        # Process-wide (TF32 tensor cores on CUDA for "high"); the benchmark runs each trial in its own process.
        torch.set_float32_matmul_precision(config.matmul_precision)
        self.output_dir = Path(config.output_dir)
        self._seed(config.seed)

        frames, self.data_span = load_training_data(config)
        train_set, val_set = build_datasets(config, frames)
        del frames
        self.sampler = GlobalBatchSampler(config.samples_per_epoch, config.batch_size, config.accumulation_steps,
                                          dist.world_size, dist.rank)
        self.steps_per_epoch = self.sampler.steps_per_epoch
        self.total_steps = self.steps_per_epoch * config.epochs
        self.loader = train_loader(train_set, config, self.sampler)
        self.val_loader = eval_loader(val_set, config, dist.world_size, dist.rank)
        self.eval_windows = len(val_set)

        self.sharded = config.parallelism == "fsdp"
        if self.sharded and not dist.enabled:
            raise KronosError("parallelism = \"fsdp\" shards over processes but this run has one; start 2+ "
                              "(kronos-tune train --nproc N, or torchrun) or use parallelism = \"ddp\"")
        # The plain module (or FSDP's sharded one) is what is saved, evaluated and loaded.
        self.parts: TrainParts = build_training(config, self.device, dist.world_size)
        self.model, self.tokenizer = self.parts.model, self.parts.tokenizer
        self.steps: PredictorSteps | TokenizerSteps = self.parts.steps
        self.optimizer = self.parts.optimizer
        self.scheduler = build_scheduler(self.optimizer, config, self.total_steps)
        self.scaler = build_grad_scaler(config, self.device)
        self.ddp: DistributedDataParallel | None = None
        train_model: nn.Module = self.model
        if dist.enabled and not self.sharded:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=ids)
            train_model = self.ddp
        if config.compile != "off":
            train_model = torch.compile(train_model, mode=None if config.compile == "default" else config.compile)
        self.train_model = train_model
        self.clock = PhaseClock(self.device, self.meter)

        self.step = 0
        self.best_val_loss = math.inf
        self.last_eval: dict[str, float] | None = None
        self._eval_step = -1
        self._saved_step = -1
        self._iter: Iterator | None = None
        self._iter_step: int | None = None
        # Dropout / sampled-s1 randomness differs per rank; a single process is rank 0.
        torch.manual_seed(config.seed + dist.rank)
        if resume is not None:
            check_same_span(read_data_span(self.output_dir), self.data_span, self.output_dir)
            self._load(resume)
        if dist.is_main:
            config.to_toml(self.output_dir / "config.toml")
            write_data_span(self.output_dir, {**self.data_span.to_dict(), "what": config.what})
            if self.tokenizer is not None and not config.tokenizer_dir and not (self.output_dir / "tokenizer").exists():
                self.tokenizer.save_pretrained(self.output_dir / "tokenizer")

    @staticmethod
    def _seed(seed: int) -> None:
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)

    # Public API -------------------------------------------------------------------------

    @property
    def global_batch_size(self) -> int:
        return self.sampler.global_batch

    @property
    def tokens_per_step(self) -> int:
        """Global tokens per optimizer step (predictor: input tokens; tokenizer: rows)."""
        return self.global_batch_size * self.steps.tokens_per_sample(self.config.window_length)

    @property
    def epoch(self) -> int:
        return self.step // self.steps_per_epoch

    def attach_meter(self, meter: PhaseMeter | None) -> None:
        """Report phases to `meter` from the next step on (None detaches)."""
        self.meter = meter
        self.clock.meter = meter

    def request_stop(self) -> None:
        """Ask fit() to stop after the current optimizer step and save a resumable checkpoint."""
        self.stop_requested = True

    def fit(self, max_steps: int | None = None) -> TrainSummary:
        """Train to global step min(max_steps, epochs x steps_per_epoch); evaluate and checkpoint on schedule."""
        target = self.total_steps if max_steps is None else min(int(max_steps), self.total_steps)
        start_step, start_time = self.step, time.perf_counter()
        last_loss: float | None = None
        interrupted = False
        config = self.config
        while self.step < target:
            record = self.train_step()
            last_loss = record.loss
            epoch_end = self.step % self.steps_per_epoch == 0
            every = config.eval_every
            if (every and self.step % every == 0) or (not every and epoch_end):
                self._evaluate_and_track(scheduled=True)
            every = config.save_every
            if (every and self.step % every == 0) or (not every and epoch_end):
                self.save_checkpoint()
            if self.step < target and self._stop_agreed():  # a stop after the last step interrupts nothing
                interrupted = True
                break
        if not interrupted and self._eval_step != self.step:
            self._evaluate_and_track(scheduled=False)
        if self._saved_step != self.step:
            self.save_checkpoint()
        done = self.step - start_step
        best_dir = self.output_dir / "best"
        return TrainSummary(
            what=config.what, steps=self.step, total_steps=self.total_steps,
            epochs_completed=self.step / self.steps_per_epoch, samples=done * self.global_batch_size,
            tokens=done * self.tokens_per_step, train_time_s=time.perf_counter() - start_time, last_loss=last_loss,
            best_val_loss=None if math.isinf(self.best_val_loss) else self.best_val_loss, last_eval=self.last_eval,
            interrupted=interrupted, checkpoint_path=str(checkpoint_path(self.output_dir)),
            best_dir=str(best_dir) if best_dir.is_dir() else None, peak_bytes_by_phase=self.clock.peaks())

    def run_steps(self, n: int) -> list[StepRecord]:
        """Exactly n real optimizer steps (no eval, no checkpoint): for timing and memory tools."""
        return [self.train_step() for _ in range(n)]

    def eval_batch(self) -> dict[str, float]:
        """Metrics of the first evaluation batch of this rank (not reduced): one real eval forward."""
        x, stamp = next(iter(self.val_loader))
        with self.clock.phase("eval"):
            sums = self._eval_sums(x, stamp)
        return self.steps.eval_metrics(sums.cpu())

    def evaluate_by_batch(self) -> list[torch.Tensor]:
        """This rank's evaluation sums, one vector per batch (not reduced; `steps.eval_metrics` reads one):
        the spread of the validation loss over its windows."""
        with self.clock.phase("eval"):
            return [self._eval_sums(x, stamp).cpu() for x, stamp in self.val_loader]

    def evaluate_by_window(self) -> torch.Tensor:
        """The evaluation sums of every validation window, one row each in the validation set's order
        ([windows, eval_width], reduced across ranks: every rank gets all of them), from batched forwards:
        two models compared window by window. Their column sums are what ``evaluate`` reduces."""
        with self.clock.phase("eval"):
            rows = torch.zeros(self.eval_windows, self.steps.eval_width, dtype=torch.float64, device=self.device)
            for indices, (x, stamp) in zip(self.val_loader.batch_sampler, self.val_loader):
                sums = evaluate_sums(self.parts, x.to(self.device), stamp.to(self.device), self.config,
                                     self.device, per_window=True)
                rows[torch.as_tensor(indices, device=self.device)] = sums
            self.dist.all_reduce_sum(rows)
        return rows.cpu()

    def evaluate(self) -> dict[str, float]:
        """Validation metrics over all eval windows, reduced across ranks.

        Predictor: val_loss, s1_accuracy, s2_accuracy (s2 conditioned on the true s1).
        Tokenizer: val_loss = recon_mse (full-code reconstruction), recon_s1_mse.
        """
        with self.clock.phase("eval"):
            sums = torch.zeros(self.steps.eval_width, dtype=torch.float64, device=self.device)
            for x, stamp in self.val_loader:
                sums += self._eval_sums(x, stamp)
            self.dist.all_reduce_sum(sums)
        return self.steps.eval_metrics(sums.cpu())

    def close(self) -> None:
        """Shut down the data loaders' worker processes (persistent ones would otherwise live until garbage
        collection or interpreter exit) and leave the process group (if this trainer joined it)."""
        self._iter = self._iter_step = None
        try:
            close_loader(self.loader)
            close_loader(self.val_loader)
        finally:
            self.dist.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def peak_bytes_seen(self) -> int | None:
        """Highest memory seen by this process: the meter's peak when one is attached, else the CUDA
        allocator's peak on GPU, else the process's peak resident set size (None where unknown)."""
        if self.meter is not None:
            return int(self.meter.peak_bytes())
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return peak_rss_bytes()

    # One optimizer step ---------------------------------------------------------------------

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, stamp = next(self._iter)
        non_blocking = self.config.pin_memory and self.device.type == "cuda"
        return x.to(self.device, non_blocking=non_blocking), stamp.to(self.device, non_blocking=non_blocking)

    def compute_gradients(self) -> float:
        """Forward and backward over this step's `accumulation_steps` micro-batches, leaving the
        accumulated gradient (of the mean loss) in ``.grad``; returns this rank's mean loss. No update."""
        config, clock = self.config, self.clock
        accumulation = config.accumulation_steps
        if self._iter is None or self._iter_step != self.step:
            self.sampler.start_step = self.step
            self._iter = iter(self.loader)
        self._iter_step = None  # unknown until this step has consumed all its micro-batches
        self.model.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for micro in range(accumulation):
            with clock.phase("data"):
                batch = self.steps.prepare(*self._next_batch())
            last = micro == accumulation - 1
            sync = self.ddp.no_sync() if self.ddp is not None and not last else contextlib.nullcontext()
            if self.sharded:  # accumulate unsharded gradients locally, reduce-scatter after the last micro-batch
                set_gradient_sync(self.model, last or config.fsdp_sync_micro_batches)
            with sync:
                loss = forward_backward(self.parts, self.train_model, batch, config, self.device, self.scaler, clock)
            loss_sum += loss.detach().double()
        self._iter_step = self.step + 1
        return float(loss_sum / accumulation)

    def train_step(self) -> StepRecord:
        """One optimizer step: accumulate gradients, unscale, clip, step, schedule; report to the callback."""
        config, clock = self.config, self.clock
        clock.clear()
        start = time.perf_counter()
        local_loss = self.compute_gradients()
        lr = float(self.optimizer.param_groups[0]["lr"])
        with clock.phase("optimizer"):
            grad_norm, skipped = optimizer_step(self.parts, self.scaler, config.effective_grad_clip)
            self._step_schedule()
        self.step += 1
        loss = torch.tensor([local_loss], dtype=torch.float64, device=self.device)
        mean_loss = float(self.dist.all_reduce_sum(loss)[0]) / self.dist.world_size
        seconds = clock.seconds
        record = StepRecord(
            step=self.step, epoch=(self.step - 1) // self.steps_per_epoch, micro_steps=config.accumulation_steps,
            samples=self.global_batch_size, tokens=self.tokens_per_step, loss=mean_loss, lr=lr,
            grad_norm=local_norm_value(grad_norm), data_time_s=seconds.get("data", 0.0),
            forward_time_s=seconds.get("forward", 0.0), backward_time_s=seconds.get("backward", 0.0),
            optimizer_time_s=seconds.get("optimizer", 0.0), step_time_s=time.perf_counter() - start,
            peak_bytes_by_phase=clock.peaks(), peak_memory_bytes=self.peak_bytes_seen(), skipped=bool(skipped))
        if self.callback is not None:
            self.callback(record)
        return record

    def _step_schedule(self) -> None:
        scheduler = self.scheduler
        if isinstance(scheduler, torch.optim.lr_scheduler.OneCycleLR):
            # Past the planned total (run_steps beyond the schedule) the last lr is kept.
            if scheduler.last_epoch + 1 < scheduler.total_steps:
                scheduler.step()

    def _stop_agreed(self) -> bool:
        flag = torch.tensor([1.0 if self.stop_requested else 0.0], device=self.device)
        return bool(self.dist.all_reduce_max(flag).item() > 0)

    # Evaluation, best model -------------------------------------------------------------------

    def _eval_sums(self, x: torch.Tensor, stamp: torch.Tensor) -> torch.Tensor:
        return evaluate_sums(self.parts, x.to(self.device), stamp.to(self.device), self.config, self.device)

    def _evaluate_and_track(self, scheduled: bool) -> dict[str, float]:
        metrics = self.evaluate()
        self.last_eval = metrics
        self._eval_step = self.step
        val_loss = metrics["val_loss"]
        if scheduled and isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            self.scheduler.step(val_loss)
        improved = val_loss < self.best_val_loss
        if improved:
            self.best_val_loss = val_loss
            best = self.save_pretrained(self.output_dir / "best")
            if self.dist.is_main:
                info = {"step": self.step, "what": self.config.what, **metrics}
                write_text_atomic(best / "metrics.json", json.dumps(info, indent=2) + "\n")
                write_data_span(best, {**self.data_span.to_dict(), "what": self.config.what, "step": self.step})
        if self.eval_callback is not None:
            epoch = max(self.step - 1, 0) // self.steps_per_epoch
            self.eval_callback(EvalRecord(self.step, epoch, dict(metrics), improved, scheduled))
        return metrics

    # Checkpoints ----------------------------------------------------------------------------

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """The whole model in the published folder format (config.json + model.safetensors), written by
        rank 0; a sharded run gathers the shards first, so every rank must call it."""
        state = full_state_dict(self.model) if self.sharded else None
        if self.dist.is_main:
            self.model.save_pretrained(directory, state_dict=state)
        self.dist.barrier()
        return Path(directory)

    def save_checkpoint(self) -> Path:
        """Write checkpoints/last.pt atomically (rank 0; every rank contributes its RNG state)."""
        rng_by_rank = self.dist.all_gather_object(capture_rng())
        path = checkpoint_path(self.output_dir)
        meta: dict[str, Any] = {
            "format": CHECKPOINT_FORMAT, "what": self.config.what, "step": self.step, "epoch": self.epoch,
            "step_in_epoch": self.step % self.steps_per_epoch, "global_batch": self.global_batch_size,
            "world_size": self.dist.world_size, "best_val_loss": self.best_val_loss,
            "eval_step": self._eval_step, "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(), "rng": rng_by_rank, "config": self.config.to_dict(),
        }
        if self.sharded:
            save_sharded_checkpoint(self.model, self.optimizer, meta, path, self.dist)
        elif self.dist.is_main:
            save_atomic({**meta, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}, path)
        self._saved_step = self.step
        return path

    def _load(self, resume: str | os.PathLike) -> None:
        state = load_checkpoint(resume, map_location="cpu")
        where = state["path"]
        if state["what"] != self.config.what:
            raise KronosError(f"{where} trains the {state['what']} but this config trains the {self.config.what}; "
                              f"resume with what = \"{state['what']}\"")
        if state["global_batch"] != self.global_batch_size:
            raise KronosError(f"{where} was written with a global batch of {state['global_batch']} windows, this run "
                              f"has {self.global_batch_size} (batch_size x accumulation_steps x processes); "
                              f"resume with the same global batch")
        if state.get(SHARDED_KEY):
            load_sharded_checkpoint(self.model, self.optimizer, state)
        elif self.sharded:
            load_whole_into_sharded(self.model, self.optimizer, state)
        else:
            try:
                self.model.load_state_dict(state["model"])
            except RuntimeError as error:
                raise KronosError(f"{where}: model weights do not fit this config's model "
                                  f"({one_line(error, typed=False)}); resume with the same model_size") from None
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.step = int(state["step"])
        self.best_val_loss = float(state["best_val_loss"])
        self._eval_step = int(state["eval_step"])
        self._saved_step = self.step
        rng = state["rng"]
        if len(rng) == self.dist.world_size:
            restore_rng(rng[self.dist.rank])
        else:  # another process count: exact continuation is impossible, keep it reproducible
            torch.manual_seed(self.config.seed + self.dist.rank + self.step)
