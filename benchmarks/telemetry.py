"""How much does the telemetry sampler slow a CPU training loop down?

    python -m benchmarks.telemetry [--repeats 7] [--interval 0.1] [--steps 40] [--budget 45]

Runs a small fixed-seed MLP training loop in interleaved repeats without (A)
and with (B) a background Sampler (A B A B ...), so drifts in machine load hit
both alike, and prints median/min/max throughput side by side with the
overhead of the medians. torch's thread count is left as it is. Each run stops
after `--steps` steps or its share of `--budget` seconds, whichever comes first,
so a slow or busy machine still finishes in time (throughput stays comparable).
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from kronos_tune.errors import KronosTuneError
from kronos_tune.telemetry.sampler import Sampler

SEED = 0
BATCH = 32
WIDTHS = (128, 512, 512, 10)
WARMUP_STEPS = 10


@dataclass
class Workload:
    description: str
    step: Callable[[], None]


def build_mlp_workload() -> Workload:
    torch.manual_seed(SEED)
    layers: list[nn.Module] = []
    for width_in, width_out in zip(WIDTHS[:-1], WIDTHS[1:]):
        layers += [nn.Linear(width_in, width_out), nn.GELU()]
    model = nn.Sequential(*layers[:-1])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = torch.randn(BATCH, WIDTHS[0])
    targets = torch.randint(0, WIDTHS[-1], (BATCH,))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()

    return Workload(f"MLP {'-'.join(map(str, WIDTHS))}, batch {BATCH}, AdamW", step)


def build_kronos_workload(preset_name: str) -> Workload:
    """The real Kronos training step of a preset's workload (kronos_core's Trainer)."""
    import tempfile

    from kronos_core.train import Trainer
    from kronos_tune.presets import resolve_preset
    from kronos_tune.workloads import train_config_from_preset

    config, _ = train_config_from_preset(resolve_preset(preset_name))
    config = config.replace(output_dir=tempfile.mkdtemp(prefix="kronos-bench-sampler-"),
                            samples_per_epoch=config.batch_size * 10_000)
    trainer = Trainer(config)
    return Workload(f"Kronos-{config.model_size} training step of preset {preset_name}, batch {config.batch_size}",
                    trainer.train_step)


def train_steps(work: Workload, steps: int, max_s: float = math.inf) -> float:
    """Run up to `steps` optimizer steps (fewer if `max_s` runs out); returns steps per second."""
    started = time.perf_counter()
    done = 0
    while done < steps:
        work.step()
        done += 1
        if time.perf_counter() - started >= max_s:
            break
    return done / (time.perf_counter() - started)


def _row(label: str, rates: list[float]) -> str:
    return f"{label:<18}{statistics.median(rates):>10.1f}{min(rates):>10.1f}{max(rates):>10.1f}"


def run(repeats: int, interval_s: float, steps: int, budget_s: float = 45.0, preset: str | None = None) -> str:
    """The benchmark; returns the printable report."""
    sampler = Sampler(interval_s=interval_s, capacity=4096)
    run_max_s = budget_s / (2 * repeats)
    work = build_kronos_workload(preset) if preset else build_mlp_workload()
    train_steps(work, 2 if preset else WARMUP_STEPS)
    without: list[float] = []
    with_sampler: list[float] = []
    samples_during_runs = 0
    for _ in range(repeats):
        without.append(train_steps(work, steps, run_max_s))  # A
        sampler.start()  # takes its first sample before the timed loop
        before = sampler.sample_count
        with_sampler.append(train_steps(work, steps, run_max_s))  # B
        samples_during_runs += sampler.sample_count - before
        sampler.stop()
    sampler.close()
    median_a, median_b = statistics.median(without), statistics.median(with_sampler)
    overhead_pct = 100.0 * (median_a - median_b) / median_a
    cost_s = sampler.mean_sample_cost_s
    lines = [
        f"sampler overhead: {work.description}, {steps} steps/run, "
        f"{repeats} repeats each (ABAB), sampler every {interval_s:g} s ({1 / interval_s:g} Hz), "
        f"each run capped at {run_max_s:.1f} s",
        f"torch {torch.__version__}, {torch.get_num_threads()} torch threads, python {platform.python_version()}",
        f"{'throughput':<18}{'median':>10}{'min':>10}{'max':>10}   (steps/s)",
        _row("without sampler", without),
        _row("with sampler", with_sampler),
        f"overhead of the medians: {overhead_pct:+.2f} % (positive = slower with the sampler)",
        f"sampler cost: {cost_s * 1000:.2f} ms per sample, {samples_during_runs} samples during the B runs, "
        f"i.e. about {100 * cost_s / interval_s:.2f} % of one core at this rate",
        f"GPU: {sampler.gpu_unavailable_reason or 'sampled through NVML'}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.telemetry", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="runs with and without the sampler (each)")
    parser.add_argument("--interval", type=float, default=0.1, help="sampler interval in seconds (default 10 Hz)")
    parser.add_argument("--steps", type=int, default=40, help="training steps per run (at most)")
    parser.add_argument("--budget", type=float, default=45.0, help="seconds for all runs together (caps each run)")
    parser.add_argument("--preset", default=None,
                        help="time the real Kronos training step of this preset (e.g. cpu) instead of the small MLP")
    args = parser.parse_args(argv)
    try:
        if args.repeats < 1 or args.steps < 1 or not args.budget > 0:
            raise KronosTuneError(
                f"--repeats {args.repeats} / --steps {args.steps} / --budget {args.budget}: "
                "repeats and steps must be at least 1, the budget positive"
            )
        print(run(args.repeats, args.interval, args.steps, args.budget, args.preset), flush=True)
    except KronosTuneError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
