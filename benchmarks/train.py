"""Benchmark of the real predictor training step: `python -m benchmarks.train`.

1. Kronos-small, eager fp32, batch 16, window 101 (lookback 90 + predict 10 + 1):
   median / min / max step time over repeated optimizer steps after one warm-up.
2. Activation checkpointing off vs all at batch 32: step time, the bytes the
   forward keeps alive for backward (activations) and the step's peak over its
   starting point, measured by StorageTracker (kronos_tune.memory.live_bytes) on
   the warm-up step; the timed steps run without the meter.

The three setups are timed round-robin, one step each in turn, so a shared
machine's changing load is spread evenly over them.

Every step is `Trainer.run_steps` on synthetic data: tokenization by the
frozen tokenizer, forward, backward, clipping, AdamW, OneCycleLR.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch

from kronos_core.train import TrainConfig, Trainer
from kronos_tune.memory.live_bytes import StorageTracker

MIB = 2**20


@dataclass
class BenchResult:
    label: str
    batch_size: int
    step_times_s: list[float]
    tokens_per_step: int
    activation_bytes: int | None = None
    step_peak_bytes: int | None = None
    cuda_peak_allocated_bytes: int | None = None

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_times_s)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.median_s


@dataclass(frozen=True)
class Setup:
    label: str
    batch_size: int
    checkpointing: str = "none"
    measure_memory: bool = False
    amp: str = "none"
    compile: str = "off"


def make_trainer(size: str, setup: Setup, repeats: int, device: str, out: str) -> Trainer:
    config = TrainConfig(model_size=size, batch_size=setup.batch_size, lookback_window=90, predict_window=10,
                         samples_per_epoch=setup.batch_size * (repeats + 3), epochs=1, eval_samples=8,
                         synthetic_series=4, synthetic_rows=1000, activation_checkpointing=setup.checkpointing,
                         amp=setup.amp, compile=setup.compile, device=device, output_dir=out)
    return Trainer(config)


def bench(setups: list[Setup], size: str, repeats: int, device: str) -> list[BenchResult]:
    """Warm each setup up (with the memory meter where asked), then time them round-robin.

    Interleaving the timed steps (A B C A B C ...) spreads the load of a shared
    machine evenly over the setups instead of favouring whichever ran when it was quiet.
    """
    trainers, results = [], []
    with tempfile.TemporaryDirectory(prefix="kronos-bench-train-") as out:
        for index, setup in enumerate(setups):
            trainer = make_trainer(size, setup, repeats, device, f"{out}/{index}")
            meter = StorageTracker() if setup.measure_memory else None
            trainer.attach_meter(meter)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            trainer.run_steps(2)  # warm-up (compile, allocator, optimizer state), measured by the meter if any
            trainer.attach_meter(None)
            result = BenchResult(setup.label, setup.batch_size, [], trainer.tokens_per_step)
            if device == "cuda":
                result.cuda_peak_allocated_bytes = torch.cuda.max_memory_allocated()
            if meter is not None:
                start = meter.entry_bytes["forward"]
                result.activation_bytes = meter.exit_bytes["forward"] - start
                result.step_peak_bytes = max(meter.peaks()["forward"], meter.peaks()["backward"]) - start
            trainers.append(trainer)
            results.append(result)
        for _ in range(repeats):
            for trainer, result in zip(trainers, results):
                result.step_times_s.append(trainer.run_steps(1)[0].step_time_s)
        for trainer in trainers:
            trainer.close()
    return results


def _row(name: str, values: list[str]) -> str:
    return f"{name:<34}" + "".join(f"{v:>20}" for v in values)


def render(results: list[BenchResult]) -> str:
    lines = [_row("", [r.label for r in results])]
    lines.append(_row("batch (windows of 101 rows)", [str(r.batch_size) for r in results]))
    lines.append(_row("step time median (s)", [f"{r.median_s:.3f}" for r in results]))
    lines.append(_row("step time min / max (s)",
                      [f"{min(r.step_times_s):.3f} / {max(r.step_times_s):.3f}" for r in results]))
    lines.append(_row("steps timed", [str(len(r.step_times_s)) for r in results]))
    lines.append(_row("input tokens / s (median)", [f"{r.tokens_per_s:,.0f}" for r in results]))
    lines.append(_row("activations kept by forward (MiB)",
                      ["-" if r.activation_bytes is None else f"{r.activation_bytes / MIB:,.1f}" for r in results]))
    lines.append(_row("step peak over its start (MiB)",
                      ["-" if r.step_peak_bytes is None else f"{r.step_peak_bytes / MIB:,.1f}" for r in results]))
    if any(r.cuda_peak_allocated_bytes is not None for r in results):
        lines.append(_row("CUDA peak allocated (MiB)",
                          ["-" if r.cuda_peak_allocated_bytes is None else f"{r.cuda_peak_allocated_bytes / MIB:,.1f}"
                           for r in results]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train", description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", help="model size (default small)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per setup (after one warm-up)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--mode", default="checkpointing", choices=("checkpointing", "precision"),
                        help="checkpointing: batch 16 and checkpointing off/all at 32 (fp32); "
                             "precision: fp32 vs bf16 vs bf16+compile at batch 50 (for GPUs)")
    parser.add_argument("--threads", type=int, default=None,
                        help="intra-op CPU threads (default: PyTorch's choice; 1 is steadier on a busy machine)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    print(f"Kronos-{args.size} predictor training step on {args.device}, "
          f"window 101 rows (100 input tokens), {torch.get_num_threads()} intra-op threads, torch {torch.__version__}",
          flush=True)
    if args.mode == "precision":
        setups = [Setup("fp32", 50), Setup("bf16", 50, amp="bf16"),
                  Setup("bf16 + compile", 50, amp="bf16", compile="default")]
        results = bench(setups, args.size, args.repeats, args.device)
        print("\nprecision at the reference finetune shape (batch 50)")
        print(render(results))
        base = results[0]
        print("\n" + "; ".join(f"{r.label}: {base.median_s / r.median_s:.2f}x fp32 speed" for r in results[1:]))
        return
    setups = [Setup("checkpointing off", 16), Setup("checkpointing off", 32, measure_memory=True),
              Setup("checkpointing all", 32, "all", measure_memory=True)]
    base, off, on = bench(setups, args.size, args.repeats, args.device)
    print("\n1) batch 16")
    print(render([base]))
    print("\n2) activation checkpointing at batch 32")
    print(render([off, on]))
    print(f"\nstep time ratio all/off: {on.median_s / off.median_s:.2f}x; activation memory ratio: "
          f"{on.activation_bytes / off.activation_bytes:.2f}x; total {time.perf_counter() - started:.0f} s")

if __name__ == "__main__":
    main()
