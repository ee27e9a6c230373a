"""Developer benchmarks: not part of the installed product (pyproject packages only kronos_core and kronos_tune).

Run each from the repository root as `python -m benchmarks.<name> --help`:

* predict: KV-cached against full-recompute generation, and the host path alone (predict_phases: its breakdown)
* load: host memory that `from_pretrained` adds, in fresh processes
* train: training-step precision and speed variants
* memory: the planner's fake-tensor estimate against the exact CPU meter
* memory_fsdp: FSDP against DDP in gloo processes, and the planner against the measurement
* plan_cold: a cold `kronos-tune plan` with and without the private PyTorch shortcuts, side by side
* telemetry: what the sampler costs a training run
* autobatch: the autobatch pick against the true largest batch
* decisions: how often the benchmark's decision rule is right under quiet and noisy load
* outside_delay: a real speed-up planted from outside the product (an optimizer step hook), found or not

Other modules here (predict_job, predict_streams, skill, ...) say what they measure in their own docstrings.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the repository root on PYTHONPATH, so that a child started with
    `python -m benchmarks.<name>` imports this folder wherever its working directory is."""
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **(extra or {})}


def run_kronos_tune(args: list[str]) -> int:
    """`kronos-tune ARGS` in this process (an entry point here has set up its planted hooks first); its exit code."""
    from kronos_tune.cli import main as cli_main

    try:
        cli_main(args)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0
