"""Benchmark: FSDP against DDP with N gloo processes on this CPU, and the planner against the measurement.

    python -m benchmarks.memory_fsdp [--size mini] [--steps 10] [--batch-size 8] [--nproc 2]

Starts torchrun with N processes (gloo); each runs the same workload twice in
one process group, DDP then FSDP, from the same initial weights on the same
windows, and reports per rank:

* every step's training loss (the max deviation FSDP vs DDP is printed);
* persistent bytes, params + grads + AdamW state, counted by the exact CPU
  meter (``CpuExactMeter.track_existing``) when the last step's optimizer
  phase starts, when all three exist (DDP's all-reduce buckets, one more
  gradient copy, are reported apart and computed, not metered);
* the peak of one steady-state step under the exact CPU meter.

Then, in this process, the planner's estimate of the same FSDP step for rank 0
of N (fake tensors, fake process group), next to rank 0's measured peak.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import child_env
from kronos_core.launch import LaunchSpec, emit_event, run_launch, torchrun_command



def bench_config(size: str, batch_size: int, parallelism: str, out: Path) -> Any:
    from kronos_core.train import TrainConfig

    return TrainConfig(model_size=size, lookback_window=90, predict_window=10, batch_size=batch_size,
                       accumulation_steps=1, samples_per_epoch=batch_size * 2 * 64, epochs=1, eval_samples=16,
                       synthetic_series=4, synthetic_rows=2000, lr=1e-3, optimizer_impl="for-loop",
                       parallelism=parallelism, output_dir=str(out / parallelism), device="cpu")


def persistent_meter_class() -> type:
    from kronos_tune.memory import CpuExactMeter

    class PersistentAtUpdate(CpuExactMeter):
        """The exact meter, which also counts params + grads + AdamW state when the optimizer phase starts
        (after backward, when all three exist)."""

        def __init__(self, trainer: Any) -> None:
            super().__init__()
            self.trainer = trainer
            self.persistent_bytes = 0

        def phase(self, name: str) -> Any:
            if name == "optimizer":
                self.persistent_bytes = CpuExactMeter().track_existing(self.trainer.model, self.trainer.optimizer)
            return super().phase(name)

    return PersistentAtUpdate


def _run_rank(size: str, steps: int, batch_size: int, out: Path) -> None:
    """One rank under torchrun: DDP then FSDP in the same process group."""
    import torch
    import torch.distributed as dist

    from kronos_core.train import Trainer

    PersistentAtUpdate = persistent_meter_class()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    report: dict[str, Any] = {"rank": dist.get_rank()}
    for parallelism in ("ddp", "fsdp"):
        with Trainer(bench_config(size, batch_size, parallelism, out)) as trainer:
            records = trainer.run_steps(steps - 1)
            meter = PersistentAtUpdate(trainer)
            with meter:  # the last step under the exact meter
                meter.track_existing(trainer.model, trainer.tokenizer, trainer.optimizer)
                meter.reset()
                trainer.attach_meter(meter)
                records.append(trainer.train_step())
                trainer.attach_meter(None)
            buckets = sum(p.numel() * p.element_size() for p in trainer.model.parameters() if p.requires_grad) \
                if trainer.ddp is not None else 0
            report[parallelism] = {"losses": [r.loss for r in records], "persistent_bytes": meter.persistent_bytes,
                                   "peak_bytes": meter.peak_bytes(), "ddp_bucket_bytes": buckets}
    emit_event("result", **report)
    dist.barrier()
    dist.destroy_process_group()


def _launch(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The ranks through the shared launcher (kronos_core.launch); each reports one "result" event."""
    with tempfile.TemporaryDirectory(prefix="kronos-fsdp-bench-") as tmp:
        command = torchrun_command(LaunchSpec(nproc=args.nproc), "benchmarks.memory_fsdp",
                                   ["--rank-worker", "--size", args.size, "--steps", str(args.steps),
                                    "--batch-size", str(args.batch_size), "--out", tmp])
        run = run_launch(command, env=child_env({"OMP_NUM_THREADS": "1"}))
        if not run.ok:
            tail = "\n".join(run.tail)
            raise SystemExit(f"torchrun failed ({run.returncode}):\n{tail}")
    reports = [{k: v for k, v in e.items() if k != "event"} for e in run.events if e.get("event") == "result"]
    return sorted(reports, key=lambda r: r["rank"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_fsdp", description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="mini")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8, help="micro-batch per rank")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_worker:
        _run_rank(args.size, args.steps, args.batch_size, Path(args.out))
        return 0
    reports = _launch(args)
    mib = 2**20
    print(f"Kronos-{args.size}, {args.nproc} gloo processes, {args.steps} steps, micro-batch {args.batch_size} "
          f"per rank, lookback 90 + predict 10, fp32")
    ddp, fsdp = reports[0]["ddp"]["losses"], reports[0]["fsdp"]["losses"]
    deviation = max(abs(a - b) for a, b in zip(ddp, fsdp))
    print(f"losses (first {len(ddp)} steps, rank 0): max |FSDP - DDP| = {deviation:.3g}")
    print(f"  ddp : {' '.join(f'{v:.6f}' for v in ddp)}")
    print(f"  fsdp: {' '.join(f'{v:.6f}' for v in fsdp)}")
    for report in reports:
        d, f = report["ddp"], report["fsdp"]
        print(f"rank {report['rank']}: persistent (params+grads+AdamW) DDP {d['persistent_bytes'] / mib:.2f} MiB "
              f"(+ {d['ddp_bucket_bytes'] / mib:.2f} MiB all-reduce buckets), FSDP {f['persistent_bytes'] / mib:.2f} "
              f"MiB = {f['persistent_bytes'] / d['persistent_bytes']:.3f}x; step peak DDP "
              f"{d['peak_bytes'] / mib:.2f} MiB, FSDP {f['peak_bytes'] / mib:.2f} MiB")
    from kronos_tune.plan.setup_traces import estimate_setup_peak

    config = bench_config(args.size, args.batch_size, "fsdp", Path(tempfile.gettempdir()) / "kronos-fsdp-bench")
    estimate = estimate_setup_peak(config, args.batch_size, args.nproc)
    measured = reports[0]["fsdp"]["peak_bytes"]
    print(f"planner FSDP estimate for rank 0: {estimate / mib:.2f} MiB; measured rank 0 peak {measured / mib:.2f} "
          f"MiB; estimate / measured = {estimate / measured:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
