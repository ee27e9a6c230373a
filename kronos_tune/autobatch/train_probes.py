"""Step and eval factories for Kronos fine-tuning at any batch size.

Real probes run kronos_core's own ``Trainer.train_step()`` / ``eval_batch()``
(data loader, tokenizer pass, forward, backward, gradient clipping, AdamW,
``zero_grad(set_to_none=True)``), so what is measured is the training step
itself. The config's model size, windows, amp, activation checkpointing,
optimizer implementation and teacher forcing are kept; what only changes the
run's length or files is replaced for the probe (synthetic data with enough
windows for a full batch, a temporary output folder, one epoch, no workers).

Estimate probes (``estimate=True``) cannot run the Trainer on fake tensors
(its loader yields real tensors and it writes files), so they run the
Trainer's own build and step parts (``kronos_core.train.builders``:
``build_training``, ``forward_backward``, ``optimizer_step``,
``evaluate_sums``) on inputs made by torch ops.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kronos_core.layers import build_position_tables
from kronos_core.train import TrainConfig, Trainer
from kronos_core.train.builders import (
    build_grad_scaler, build_training, evaluate_sums, forward_backward, optimizer_step,
)
from kronos_core.train.fsdp import gather_once
from kronos_tune.autobatch.probes import AutobatchResult, OnProbe, ProbeStep
from kronos_tune.autobatch.search import autobatch
from kronos_tune.errors import KronosTuneError
from kronos_tune.memory.estimate import CudaEmulation
from kronos_tune.memory.meters import MeterSwitch

MIN_VAL_WINDOWS_PER_SERIES = 64
OPTIMIZER_EMULATION = {"auto": "fused", "fused": "fused", "foreach": "foreach", "for-loop": "as_built"}


class TrainProbes:
    """Factories for ``autobatch`` at any batch size, for one TrainConfig on one device.

    Use as a context manager (or call ``close()``): probes write the Trainer's
    files into a temporary folder that is removed at the end.
    """

    def __init__(self, config: TrainConfig, device: str = "cpu", mesh: Any = None) -> None:
        self.config = config
        # A sharded (fsdp) config is estimated as rank 0 of `mesh` (kronos_tune.plan.setup_traces.SimulatedRanks).
        self.mesh = mesh
        self.device = torch.device(device).type
        self.notes: list[str] = []
        self._tmp = tempfile.TemporaryDirectory(prefix="kronos-autobatch-")
        self.work_dir = Path(self._tmp.name)
        self._current: tuple[int, Any] | None = None  # (batch size, trainer or fake-safe step) of the open probe
        amp = config.amp
        if amp == "fp16" and self.device == "cpu":
            amp = "bf16"
            self.notes.append("amp fp16 probed as bf16 on the CPU (same 2-byte activations; the fp16 grad scaler "
                              "adds a few scalars on CUDA)")
        self.amp = amp
        if config.compile != "off":
            self.notes.append(f"compile={config.compile} is off in the probes (a compiled step usually needs less "
                              "memory, so the pick is on the safe side)")
        if not config.is_synthetic:
            self.notes.append("probes train on synthetic windows of the same shape as the configured data "
                              "(memory depends on shapes, not values)")

    # configs ------------------------------------------------------------------------------
    def probe_config(self, batch_size: int, estimate: bool = False) -> TrainConfig:
        """The config a probe at ``batch_size`` runs: same model and step, enough synthetic windows for one batch."""
        c = self.config
        length = c.window_length
        val_rows = length + MIN_VAL_WINDOWS_PER_SERIES
        rows = max(c.synthetic_rows, math.ceil(val_rows / c.val_fraction) + length + 1)
        series = max(c.synthetic_series, math.ceil(batch_size / MIN_VAL_WINDOWS_PER_SERIES) + 1)
        changes: dict[str, Any] = dict(
            batch_size=batch_size, accumulation_steps=1, data=["synthetic"], synthetic_series=series,
            synthetic_rows=rows, samples_per_epoch=4 * batch_size, epochs=1, eval_samples=batch_size,
            eval_every=0, save_every=0, num_workers=0, pin_memory=False, compile="off",
            output_dir=str(self.work_dir / "probe"), device=self.device, amp=self.amp,
        )
        if estimate:
            # CPU offload only changes where the shards live (host, not device): the planner accounts for it.
            changes.update(tokenizer_dir=None, predictor_dir=None, device="cpu", fsdp_cpu_offload=False)
        return c.replace(**changes)

    def final_config(self, batch_size: int, accumulation_steps: int) -> TrainConfig:
        """The user's config at the pick (samples_per_epoch raised if one optimizer step would not fit in it)."""
        c = self.config
        return c.replace(batch_size=batch_size, accumulation_steps=accumulation_steps,
                         samples_per_epoch=max(c.samples_per_epoch, batch_size * accumulation_steps))

    def cuda_emulation(self) -> CudaEmulation:
        """How a fake CPU run approximates this config on CUDA (the budget is already net of the context)."""
        return CudaEmulation(context_overhead_bytes=0,
                             optimizer_impl=OPTIMIZER_EMULATION[self.config.optimizer_impl])  # type: ignore[arg-type]

    # real probes (kronos_core's Trainer) ---------------------------------------------------
    def step_factory(self, batch_size: int) -> ProbeStep:
        if self.config.parallelism == "fsdp":
            raise KronosTuneError("a parallelism = \"fsdp\" config shards over several processes, which one "
                                  "probe process cannot run: use the estimate (fake tensors, rank 0 of N simulated)")
        slot = MeterSwitch(None, always=True)
        trainer = Trainer(self.probe_config(batch_size), meter=slot)
        self._current = (batch_size, (trainer, slot))

        def run(meter: Any = None) -> None:
            slot.meter = meter
            trainer.train_step()

        def close() -> None:
            trainer.close()
            slot.meter = None
            self._current = None

        return ProbeStep(run, trainer.model, trainer.optimizer, on_close=close)

    def eval_factory(self, batch_size: int) -> Callable[..., Any]:
        trainer, slot = self._open(batch_size)

        def evaluate(meter: Any = None) -> None:
            slot.meter = meter
            trainer.eval_batch()

        return evaluate

    def _open(self, batch_size: int) -> Any:
        if self._current is None or self._current[0] != batch_size:
            raise RuntimeError(f"eval_factory({batch_size}) needs the probe step of the same batch size first")
        return self._current[1]

    # estimate probes (the Trainer's step parts on inputs made by torch ops) ----------------
    def estimate_step_factory(self, batch_size: int) -> ProbeStep:
        """A fake-safe step at `batch_size`: the Trainer's own build and step parts (kronos_core.train.builders),
        on a batch made by torch ops instead of the Trainer's loader (which yields real tensors)."""
        config = self.probe_config(batch_size, estimate=True)
        cpu = torch.device("cpu")
        if config.parallelism == "fsdp" and self.mesh is None:
            raise KronosTuneError("estimating a parallelism = \"fsdp\" config needs the simulated ranks: "
                                  "TrainProbes(config, mesh=SimulatedRanks(N).mesh) inside `with SimulatedRanks(N)`")
        parts = build_training(config, cpu, self.mesh.size() if self.mesh is not None else 1, mesh=self.mesh)
        model, optimizer, steps = parts.model, parts.optimizer, parts.steps
        scaler = build_grad_scaler(config, cpu)
        slot = MeterSwitch(None, always=True)
        length = config.window_length
        clip = config.effective_grad_clip

        def inputs(size: int) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randn(size, length, 6), torch.zeros(size, length, 5)

        def run(meter: Any = None, size: int = batch_size) -> None:
            """One step at `size` (the factory's batch size unless given: nothing else depends on it)."""
            slot.meter = meter
            model.train()
            with slot.phase("data"):
                micro = steps.prepare(*inputs(size))
            loss = forward_backward(parts, model, micro, config, cpu, scaler, slot)
            loss_sum = loss.detach().double()
            with slot.phase("optimizer"):
                optimizer_step(parts, scaler, clip)
            del loss_sum

        def prime() -> None:
            """What the first step creates and keeps, without its forward and backward: the position tables (the
            tokenizer's through a one-window encode), AdamW state from zero gradients through the step's own
            clipping and optimizer calls, and FSDP's gathered-parameter buffers (gathered and freed once). The
            next step then makes the same allocations as every later one."""
            steps.prepare(*inputs(1))
            build_position_tables(model, steps.tokens_per_sample(length))
            for group in optimizer.param_groups:
                for param in group["params"]:
                    param.grad = torch.zeros_like(param)
            optimizer_step(parts, scaler, clip)
            gather_once(model)

        def evaluate(meter: Any = None) -> None:
            slot.meter = meter
            with slot.phase("eval"):
                evaluate_sums(parts, *inputs(batch_size), config, cpu)

        def close() -> None:
            slot.meter = None
            self._current = None

        self._current = (batch_size, evaluate)
        return ProbeStep(run, model, optimizer, on_close=close, prime=prime)

    def estimate_eval_factory(self, batch_size: int) -> Callable[..., Any]:
        return self._open(batch_size)

    # running ----------------------------------------------------------------------------------
    def run(self, budget_bytes: int, margin: float | None = None, max_probes: int = 6, estimate: bool = False,
            cuda_emulation: CudaEmulation | None = None, effective_batch: int | None = None, min_batch: int = 1,
            max_batch: int = 4096, round_bytes: int = 1, on_probe: OnProbe | None = None) -> AutobatchResult:
        """autobatch over this config: real Trainer steps on ``self.device``, or fake ones with ``estimate``."""
        if estimate:
            result = autobatch(self.estimate_step_factory, budget_bytes, margin=margin, max_probes=max_probes,
                               min_batch=min_batch, max_batch=max_batch, eval_factory=self.estimate_eval_factory,
                               estimate=True, effective_batch=effective_batch, cuda_emulation=cuda_emulation,
                               on_probe=on_probe)
        else:
            result = autobatch(self.step_factory, budget_bytes, margin=margin, max_probes=max_probes,
                               min_batch=min_batch, max_batch=max_batch, eval_factory=self.eval_factory,
                               device=self.device, effective_batch=effective_batch, round_bytes=round_bytes,
                               on_probe=on_probe)
        result.notes[:0] = self.notes
        return result

    def close(self) -> None:
        self._current = None
        self._tmp.cleanup()

    def __enter__(self) -> TrainProbes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
