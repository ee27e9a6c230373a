"""Per-rank script for tests/test_train_fsdp.py, run under torchrun with 2 gloo processes.

One process group serves several Trainers (each sees it already joined), so one
torchrun start checks: DDP vs FSDP losses, a sharded save + resume against the
uninterrupted run, the full-model export, and the per-rank peak of an FSDP step
under the exact CPU meter, and the benchmark's measurement agreeing its stops across
ranks. Rank 0 writes everything to OUT/results.json.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from kronos_core.model import Kronos
from kronos_core.train import TrainConfig, Trainer
from kronos_tune.memory import CpuExactMeter
from kronos_tune.benchmark.train.measure import TrialSession, TrialSteps

STEPS = 4


def config(out: Path, name: str, **fields) -> TrainConfig:
    values = dict(model_size="tiny", lookback_window=16, predict_window=4, batch_size=4, accumulation_steps=2,
                  samples_per_epoch=64, epochs=1, eval_samples=16, synthetic_series=2, synthetic_rows=200,
                  lr=1e-3, optimizer_impl="for-loop", output_dir=str(out / name), device="cpu")
    values.update(fields)
    return TrainConfig(**values)


def losses(trainer: Trainer, steps: int) -> list[float]:
    return [record.loss for record in trainer.run_steps(steps)]


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    results: dict = {}
    with Trainer(config(out, "ddp")) as ddp:
        results["ddp"] = losses(ddp, STEPS)
    fsdp = Trainer(config(out, "fsdp", parallelism="fsdp"))
    results["fsdp"] = losses(fsdp, STEPS)

    # Full-model export from the sharded run, and the sharded model's own prediction on fixed tokens.
    fsdp.save_pretrained(out / "export")
    generator = torch.Generator().manual_seed(0)
    s1 = torch.randint(0, 1024, (2, 12), generator=generator)
    s2 = torch.randint(0, 1024, (2, 12), generator=generator)
    stamp = torch.zeros(2, 12, 5)
    fsdp.model.eval()
    with torch.no_grad():
        sharded_s1, sharded_s2 = fsdp.model(s1, s2, stamp, use_teacher_forcing=True, s1_targets=s1)
    if rank == 0:
        loaded = Kronos.from_pretrained(out / "export").eval()
        with torch.no_grad():
            plain_s1, plain_s2 = loaded(s1, s2, stamp, use_teacher_forcing=True, s1_targets=s1)
        results["export_max_abs_diff"] = max((plain_s1 - sharded_s1).abs().max().item(),
                                             (plain_s2 - sharded_s2).abs().max().item())
    fsdp.close()

    # Interrupted after 2 steps (sharded checkpoint), resumed in a new Trainer for the last 2.
    with Trainer(config(out, "first", parallelism="fsdp")) as first:
        head = losses(first, STEPS // 2)
        first.save_checkpoint()
    with Trainer(config(out, "resumed", parallelism="fsdp"), resume=out / "first") as resumed:
        results["resumed"] = head + losses(resumed, STEPS - STEPS // 2)
        results["resumed_step"] = resumed.step

    # A DDP checkpoint (whole tensors) resumed into a sharded model.
    with Trainer(config(out, "ddp_first")) as first:
        head = losses(first, STEPS // 2)
        first.save_checkpoint()
    with Trainer(config(out, "ddp_to_fsdp", parallelism="fsdp"), resume=out / "ddp_first") as resumed:
        results["ddp_to_fsdp"] = head + losses(resumed, STEPS - STEPS // 2)

    # Per-rank peak of the steady-state FSDP step (batch 4, no accumulation) under the exact CPU meter.
    meter = CpuExactMeter()
    with Trainer(config(out, "metered", parallelism="fsdp", accumulation_steps=1)) as metered:
        metered.run_steps(1)
        gc.collect()  # earlier Trainers' garbage is not this step's memory
        with meter:
            meter.track_existing(metered.model, metered.tokenizer, metered.optimizer)
            meter.reset()
            metered.attach_meter(meter)
            metered.run_steps(1)
        peaks = [None] * dist.get_world_size()
        dist.all_gather_object(peaks, meter.peak_bytes())
        results["metered_peaks"] = peaks

    # The benchmark's measurement when the ranks' own clocks would decide differently (rank 0 settles and has
    # a tight interval at once, rank 1 never): agreed, both leave warm-up and measurement at the same step;
    # each on its own, rank 0 would leave while rank 1 waits in a collective for good.
    eager = rank == 0
    trial_steps = TrialSteps(min_warmup=2, max_warmup=4, settle_tolerance=1e9 if eager else 0.0, min_steps=2,
                             max_steps=5, target_ci=1e9 if eager else 0.0, budget_s=1e9)
    session = TrialSession(config(out, "measured"), None, trial_steps, agree_across_ranks=True)
    try:
        measured = session.run(session.open, session.warm_up, session.measure, session.finish)
    finally:
        session.close()
    counts = [None] * dist.get_world_size()
    dist.all_gather_object(counts, [len(measured.warmup_times_s), len(measured.timed), measured.timing["stop"]])
    results["measured"] = counts

    if rank == 0:
        (out / "results.json").write_text(json.dumps(results), encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
