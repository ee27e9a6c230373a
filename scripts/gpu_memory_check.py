"""Fake-tensor estimate (CUDA-emulated) vs the real step's peak, for Kronos-small at batch 50.

    python scripts/gpu_memory_check.py [--size small] [--batch 50 ...] [--modes fp32 bf16 checkpointing]

On CUDA the real side is torch.cuda.max_memory_allocated over the second
training step (AdamW state alive); on the CPU it is the exact CPU meter, so the
script can be tried anywhere. Both sides run the same Trainer step shape.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from kronos_core.train import TrainConfig, Trainer
from kronos_tune.autobatch.train_probes import TrainProbes
from kronos_tune.memory import CpuExactMeter, CudaEmulation, estimate_step_peak

MIB = 2**20


def real_peak_bytes(config: TrainConfig) -> int:
    """Peak allocated bytes during the second optimizer step of the real Trainer."""
    trainer = Trainer(config)
    try:
        trainer.run_steps(1)
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            trainer.run_steps(1)
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        meter = CpuExactMeter()
        meter.track_existing(trainer.model, trainer.optimizer, trainer.tokenizer)
        with meter:
            trainer.run_steps(1)
        return meter.peak_bytes()
    finally:
        trainer.close()


def estimated_peak_bytes(config: TrainConfig, batch: int, emulate_cuda: bool) -> int:
    task = TrainProbes(config, device="cpu")
    holder = {}

    def build():
        holder["step"] = task.estimate_step_factory(batch)
        return holder["step"].model, holder["step"].optimizer

    def step(model, optimizer, batch_size, meter=None):
        holder["step"](meter)

    emulation = CudaEmulation(context_overhead_bytes=0, workspace_bytes=0) if emulate_cuda else None
    try:
        return estimate_step_peak(build, step, batch, steps=2, cuda_emulation=emulation).allocated_peak_bytes
    finally:
        task.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--batch", type=int, nargs="+", default=[50])
    parser.add_argument("--modes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "checkpointing"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"Kronos-{args.size}, window 101, device {args.device}; estimate on fake CPU tensors"
          f"{' with CUDA emulation (512 B rounding)' if args.device == 'cuda' else ''}; real: step 2 "
          f"({'torch.cuda.max_memory_allocated' if args.device == 'cuda' else 'exact CPU meter'})")
    print(f"{'mode':<15}{'batch':>6}{'estimate MiB':>14}{'real MiB':>12}{'diff':>9}")
    for mode in args.modes:
        amp = "bf16" if mode == "bf16" else "none"
        checkpointing = "all" if mode == "checkpointing" else "none"
        for batch in args.batch:
            with tempfile.TemporaryDirectory() as out:
                config = TrainConfig(model_size=args.size, batch_size=batch, lookback_window=90, predict_window=10,
                                     samples_per_epoch=batch * 4, eval_samples=batch, synthetic_series=4,
                                     synthetic_rows=2000, amp=amp, activation_checkpointing=checkpointing,
                                     device=args.device, output_dir=out)
                real = real_peak_bytes(config)
                estimate = estimated_peak_bytes(config, batch, emulate_cuda=args.device == "cuda")
            print(f"{mode:<15}{batch:>6}{estimate / MIB:>14,.1f}{real / MIB:>12,.1f}{(estimate - real) / real:>+9.2%}",
                  flush=True)

if __name__ == "__main__":
    main()
