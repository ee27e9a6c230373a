"""A stop signal to a training run's whole process group, loader workers included (a terminal's Ctrl-C, `kill --
-PGID`, a launcher): the main process alone decides, stops at the step boundary, saves a resumable checkpoint,
shuts its workers down and exits 130. Real runs of the tiny model in their own session, real signals."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from kronos_core.train import TrainConfig, Trainer, load_checkpoint
from machine import process_gone
from tiny_preset import tiny_train_toml

# Eight micro-batches per step: after the signal the main process needs more batches than the workers
# prefetched (2 workers x 2), so a dead worker shows. Evaluation every 2 steps starts the eval loader's workers.
CONFIG = tiny_train_toml(batch_size=2, accumulation_steps=8, epochs=500, eval_every=2, num_workers=2)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def step_after_eval(path: Path, kind_key: str, eval_kind: str, step_kind: str) -> int | None:
    """The step of the first optimizer step logged after the first evaluation in `path` (None: not yet)."""
    evaluated = False
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        start = line.find("{")
        try:
            record = json.loads(line[start:]) if start >= 0 else {}
        except json.JSONDecodeError:
            continue  # a line being written
        kind = record.get(kind_key)
        evaluated = evaluated or kind == eval_kind
        if evaluated and kind == step_kind:
            return int(record["step"])
    return None


def core_entry(config: Path, out: Path, tmp: Path) -> tuple[list[str], Callable[[], int | None]]:
    """`python -m kronos_core.train --events` (what torchrun runs on every rank): its events on stdout."""
    stdout = tmp / "stdout.txt"
    return ([sys.executable, "-m", "kronos_core.train", "--config", str(config), "--events"],
            lambda: step_after_eval(stdout, "event", "eval", "step"))


def cli_entry(config: Path, out: Path, tmp: Path) -> tuple[list[str], Callable[[], int | None]]:
    """`kronos-tune train` in process: its metrics.jsonl, written line by line."""
    return ([sys.executable, "-m", "kronos_tune.cli", "train", "--config", str(config), "--out", str(out)],
            lambda: step_after_eval(out / "metrics.jsonl", "kind", "eval", "train"))


@pytest.mark.parametrize(("entry", "signum"), [(cli_entry, signal.SIGINT), (core_entry, signal.SIGTERM)],
                         ids=["kronos-tune-train-SIGINT", "kronos_core.train-SIGTERM"])
def test_stop_signal_to_the_process_group_saves_and_exits_130_with_workers_gone(tmp_path: Path, entry,
                                                                                 signum: int) -> None:
    out = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(CONFIG + f'output_dir = "{out}"\n')
    command, progress = entry(config, out, tmp_path)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(tmp_path / "stdout.txt", "w") as stdout, open(tmp_path / "stderr.txt", "w") as stderr:
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=stdout, stderr=stderr,
                                start_new_session=True,  # a process group of its own, as a terminal's job
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while (seen := progress()) is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen is not None, (tmp_path / "stderr.txt").read_text()
        # Both loaders' persistent workers (training and evaluation) are up and get the signal too.
        workers = [child for child in psutil.Process(proc.pid).children(recursive=True)
                   if child.name() == "pt_data_worker"]
        assert len(workers) == 4, workers
        os.killpg(proc.pid, signum)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stderr_text = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 130, (tmp_path / "stdout.txt").read_text()[-2000:] + stderr_text
    assert "Traceback" not in stderr_text and "DataLoader worker" not in stderr_text, stderr_text
    assert all(process_gone(worker.pid, within_s=5.0) for worker in workers)
    stopped = load_checkpoint(out)["step"]
    assert stopped >= seen

    # The checkpoint continues the run (workers or not, the batches are the same).
    resumed = TrainConfig.from_toml(out / "config.toml").replace(num_workers=0)
    with Trainer(resumed, resume=out) as trainer:
        assert trainer.step == stopped
        assert trainer.fit(stopped + 1).steps == stopped + 1


FORKSERVER_SCRIPT = """\
import sys
import time

from kronos_core.train import TrainConfig
from kronos_core.train.loading import GlobalBatchSampler, build_datasets, train_loader
from kronos_core.signals import StopForwarder, stop_on_signals


def main():
    config = TrainConfig(model_size="tiny", lookback_window=16, predict_window=4, batch_size=2,
                         samples_per_epoch=64, eval_samples=8, synthetic_series=2, synthetic_rows=200,
                         num_workers=2, compile="default", output_dir=sys.argv[1])
    train_set, _ = build_datasets(config)
    loader = train_loader(train_set, config, GlobalBatchSampler(64, 2, 1, 1, 0))
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    stopper = StopForwarder()
    with stop_on_signals(stopper, second_interrupts=False):
        batches = iter(loader)
        next(batches), next(batches)  # one batch from each worker: both are up
        print("serving", flush=True)
        deadline = time.monotonic() + 30
        while not stopper.requested and time.monotonic() < deadline:
            next(batches)
        served, until = 0, time.monotonic() + 1.5  # the test's second signal arrives in this while
        while served < 12 or time.monotonic() < until:  # more than prefetched: the workers must still serve
            next(batches)
            served += 1
        print(f"stop requested: {stopper.requested}", flush=True)
        time.sleep(120)  # until the test kills this process


if __name__ == "__main__":
    main()
"""


def test_forkserver_workers_of_compiled_runs_outlive_signals_to_the_group_but_not_the_main_process(
        tmp_path: Path) -> None:
    """Compiled runs start loader workers from a forkserver, their parent: it and they must ignore the group's
    Ctrl-C and SIGTERM (multiprocessing spares the server SIGINT only, and a worker that has not run its
    worker_init_fn yet would take Ctrl-C as KeyboardInterrupt). Killed outright, the main process leaves
    nothing behind: torch's workers only watch their parent, the server, which waits for them."""
    script = tmp_path / "serve.py"
    script.write_text(FORKSERVER_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "out")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    helpers: list[psutil.Process] = []
    try:
        assert proc.stdout.readline().strip() == "serving", proc.stderr.read()
        helpers = psutil.Process(proc.pid).children(recursive=True)  # the forkserver, its workers
        assert len([helper for helper in helpers if helper.name() == "pt_data_worker"]) == 2, helpers
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGTERM)
        line = proc.stdout.readline().strip()
        assert line == "stop requested: True", line + proc.stderr.read()
        proc.kill()
        proc.wait()
        assert all(process_gone(helper.pid, within_s=10.0) for helper in helpers)
    finally:
        for process in (proc, *helpers):
            with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
                process.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
