"""Per-process training entry, what torchrun runs on every rank.

    torchrun --nproc-per-node 2 -m kronos_core.train --config run.toml [--steps N] [--resume DIR]

Also runs as a single process (``python -m kronos_core.train --config run.toml``).
With ``--events`` (alias ``--jsonl``) rank 0 prints its progress as launcher
events (``kronos_core.launch.emit_event``): ``start`` (step, total_steps),
one ``step`` per optimizer step (a StepRecord's fields), one ``eval`` per
evaluation (an EvalRecord's), and ``summary`` at the end; every rank reports
a failure as an ``error`` event (rank, message). That is what ``kronos-tune
train --nproc`` reads through ``kronos_core.launch.run_launch`` to draw its
progress bar and write the run's metrics. Without the flag nothing is
printed on success. Exit codes: 0 done, 130 stopped by SIGINT/SIGTERM after
saving a resumable checkpoint, 1 out of memory, 2 a user-fixable problem
(one line).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from kronos_core.errors import KronosError
from kronos_core.launch import emit_event
from kronos_core.train.config import TrainConfig
from kronos_core.train.records import EvalRecord, StepRecord
from kronos_core.signals import StopForwarder, stop_on_signals
from kronos_core.train.trainer import Trainer
from kronos_core.units import format_bytes

EXIT_OOM = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def oom_message(step: int, peak_bytes: int | None, where: str) -> str:
    peak = format_bytes(peak_bytes, "GiB", missing="unknown")
    return (f"out of memory in training step {step + 1} on {where} (peak seen {peak}); lower batch_size "
            f"(raise accumulation_steps to keep the global batch) - `kronos-tune autobatch` finds one that fits; "
            f"the last checkpoint was left untouched")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kronos_core.train", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="TOML file with TrainConfig keys")
    parser.add_argument("--steps", type=int, default=None, help="stop at this global optimizer step")
    parser.add_argument("--resume", default=None, help="output folder (or checkpoints/last.pt) to resume from")
    parser.add_argument("--events", "--jsonl", dest="events", action="store_true",
                        help="rank 0 prints its progress as launcher events (kronos_core.launch)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    trainer: Trainer | None = None
    rank = int(os.environ.get("RANK", "0"))

    def fail(message: str, kind: str) -> None:
        if args.events:  # the launcher shows it once, naming the rank
            emit_event("error", rank=rank, message=message, kind=kind)
        else:
            print(f"error: {message}", file=sys.stderr, flush=True)

    try:
        config = TrainConfig.from_toml(args.config)
        if args.steps is not None and args.steps < 1:
            raise KronosError(f"--steps {args.steps}: give a positive number of optimizer steps")

        def on_step(record: StepRecord) -> None:
            emit_event("step", **record.to_dict())

        def on_eval(record: EvalRecord) -> None:
            emit_event("eval", **record.to_dict())

        stopper = StopForwarder()
        with stop_on_signals(stopper, second_interrupts=False):
            trainer = Trainer(config, resume=args.resume)
            stopper.attach(trainer)
            reports = args.events and trainer.dist.is_main
            if reports:
                trainer.callback, trainer.eval_callback = on_step, on_eval
                emit_event("start", step=trainer.step, total_steps=trainer.total_steps,
                           world_size=trainer.dist.world_size)
            summary = trainer.fit(args.steps)
        if reports:
            emit_event("summary", **summary.to_dict())
        return EXIT_INTERRUPTED if summary.interrupted else 0
    except KronosError as error:
        fail(str(error), "usage")
        return EXIT_USAGE
    except torch.OutOfMemoryError:
        step = trainer.step if trainer is not None else 0
        peak = trainer.peak_bytes_seen() if trainer is not None else None
        where = f"rank {trainer.dist.rank} ({trainer.device})" if trainer is not None else "this process"
        fail(oom_message(step, peak, where), "oom")
        return EXIT_OOM
    finally:
        if trainer is not None:
            trainer.close()


if __name__ == "__main__":
    sys.exit(main())
