"""Per-process training entry, what torchrun runs on every rank.

    torchrun --nproc-per-node 2 -m kronos_core.train --config run.toml [--steps N] [--resume DIR]

Also runs as a single process (``python -m kronos_core.train --config run.toml``).
With ``--jsonl`` rank 0 prints one ``KRONOS_STEP {json}`` line per optimizer
step and a ``KRONOS_SUMMARY {json}`` line at the end (what ``kronos-tune train
--nproc`` reads to draw its progress bar); otherwise nothing is printed on
success. Exit codes: 0 done, 130 stopped by SIGINT/SIGTERM after saving a
resumable checkpoint, 1 out of memory, 2 a user-fixable problem (one line).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from kronos_core.errors import KronosError
from kronos_core.train.config import TrainConfig
from kronos_core.train.records import StepRecord
from kronos_core.train.signals import StopForwarder, stop_on_signals
from kronos_core.train.trainer import Trainer

STEP_PREFIX = "KRONOS_STEP "
SUMMARY_PREFIX = "KRONOS_SUMMARY "
EXIT_OOM = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def oom_message(step: int, peak_bytes: int | None, where: str) -> str:
    peak = "unknown" if peak_bytes is None else f"{peak_bytes / 2**30:.2f} GiB"
    return (f"out of memory in training step {step + 1} on {where} (peak seen {peak}); lower batch_size "
            f"(raise accumulation_steps to keep the global batch) - `kronos-tune autobatch` finds one that fits; "
            f"the last checkpoint was left untouched")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kronos_core.train", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="TOML file with TrainConfig keys")
    parser.add_argument("--steps", type=int, default=None, help="stop at this global optimizer step")
    parser.add_argument("--resume", default=None, help="output folder (or checkpoints/last.pt) to resume from")
    parser.add_argument("--jsonl", action="store_true", help="rank 0 prints step records as JSON lines")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    trainer: Trainer | None = None
    try:
        config = TrainConfig.from_toml(args.config)
        if args.steps is not None and args.steps < 1:
            raise KronosError(f"--steps {args.steps}: give a positive number of optimizer steps")

        def emit(record: StepRecord) -> None:
            print(STEP_PREFIX + json.dumps(record.to_dict()), flush=True)

        stopper = StopForwarder()
        with stop_on_signals(stopper, second_interrupts=False):
            trainer = Trainer(config, resume=args.resume)
            stopper.attach(trainer)
            if args.jsonl and trainer.dist.is_main:
                trainer.callback = emit
            summary = trainer.fit(args.steps)
        if args.jsonl and trainer.dist.is_main:
            print(SUMMARY_PREFIX + json.dumps(summary.to_dict()), flush=True)
        return EXIT_INTERRUPTED if summary.interrupted else 0
    except KronosError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except torch.OutOfMemoryError:
        step = trainer.step if trainer is not None else 0
        peak = trainer.peak_bytes_seen() if trainer is not None else None
        where = f"rank {trainer.dist.rank} ({trainer.device})" if trainer is not None else "this process"
        print(f"error: {oom_message(step, peak, where)}", file=sys.stderr, flush=True)
        return EXIT_OOM
    finally:
        if trainer is not None:
            trainer.close()


if __name__ == "__main__":
    sys.exit(main())
