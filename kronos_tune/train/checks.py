"""The user's job checked against its data before it runs: what an epoch is, how often each window is seen, and
whether the validation windows can resolve a change in val loss. `train` and `benchmark` print these lines in
their plan."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kronos_core.train import TrainConfig

if TYPE_CHECKING:  # counting reads the data (torch, pandas): only when a job is checked
    from kronos_core.train.loading import WindowCount

MIN_VAL_WINDOWS = 30  # below this, the validation loss of two runs cannot tell a small change from noise


def resolvable_share(windows: int) -> float:
    """The smallest change in mean val loss, as a share of the per-window spread, that `windows` windows
    resolve at about 95%: 2 standard errors of the mean (paired windows, as the benchmark compares them)."""
    return 2.0 / math.sqrt(max(windows, 1))


def job_checks(config: TrainConfig, upstream: bool = False, counted: WindowCount | None = None) -> list[str]:
    """The lines of the check (none for synthetic data); `upstream`: the config came from a finetune_csv YAML,
    whose epoch is one pass over the training windows; `counted`: the data's windows, when already counted."""
    if config.is_synthetic:
        return []
    if counted is None:
        from kronos_core.train.loading import count_windows

        counted = count_windows(config)
    per_step = config.batch_size * config.accumulation_steps
    steps = config.epochs * (config.samples_per_epoch // per_step)
    lines = []
    if upstream:
        lines.append(f"epoch: one pass over the {counted.train:,} training windows of the data, as upstream's "
                     f"finetune_csv counts it (samples_per_epoch {config.samples_per_epoch:,}): {config.epochs} "
                     f"epochs = {steps:,} optimizer steps")
    elif counted.train and config.samples_per_epoch > counted.train:
        seen = config.epochs * config.samples_per_epoch / counted.train
        lines.append(f"warning: {config.epochs} epochs = {steps:,} steps over {counted.train:,} windows: each seen "
                     f"{seen:,.0f} times (samples_per_epoch {config.samples_per_epoch:,} is more than the training "
                     f"windows the data has; samples_per_epoch = {counted.train} makes an epoch one pass)")
    used = min(counted.val, config.eval_samples)
    if used < MIN_VAL_WINDOWS:
        noun = "window" if used == 1 else "windows"
        lines.append(f"warning: {used} validation {noun}: a change in val loss under "
                     f"{100 * resolvable_share(used):.0f}% of its per-window spread cannot be resolved with {used} "
                     f"{noun} (raise val_fraction or give more data; the benchmark states it in % of the loss "
                     f"once its baseline is measured)")
    else:
        lines.append(f"validation: {used:,} windows" + (f" of the {counted.val:,} the data has (eval_samples)"
                                                         if used < counted.val else ""))
    lines.append(memory_check(config))
    return lines


def free_memory(device: str) -> tuple[int, str]:
    """The bytes this machine has free now for `device` ("cuda": the card's, else RAM) and what they are."""
    if device == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info()
        return free, f"free on {torch.cuda.get_device_name()}"
    import psutil

    return psutil.virtual_memory().available, "of RAM free"


def memory_check(config: TrainConfig) -> str:
    """The step's projected peak at the job's batch against this machine's free memory, and the micro-batch
    autobatch would pick for the same effective batch: autobatch's search on fake tensors (nothing allocated)."""
    from kronos_core.units import format_bytes
    from kronos_tune.autobatch.train_probes import TrainProbes

    device = config.resolved_device()
    free, where = free_memory(device)
    effective = config.batch_size * config.accumulation_steps
    shape = config.replace(symbol_column=None, date_format=None, train_until=None)  # probes read synthetic data
    with TrainProbes(shape, device=device) as task:
        emulation = task.cuda_emulation() if device == "cuda" else None
        result = task.run(free, max_probes=4, estimate=True, cuda_emulation=emulation, effective_batch=effective)
    peak = round(result.fixed_bytes + result.bytes_per_sample * config.batch_size)
    fits = "fits" if peak <= result.usable_bytes else "does NOT fit"
    pick = f"batch_size = {result.batch_size}" + (f" x accumulation_steps = {result.accumulation_steps}"
                                                  if result.accumulation_steps > 1 else "")
    return (f"memory: projected peak {format_bytes(peak)} at batch {config.batch_size} ({device}, fake-tensor "
            f"estimate) {fits} the {format_bytes(free)} {where} now; autobatch would pick {pick} for the effective "
            f"batch {effective}")
