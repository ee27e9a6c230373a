"""Prediction over torchrun processes (real gloo ranks claiming chunks), the predict benchmark's sharding trial
over the same ranks, and the launcher that starts and stops them."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kronos_core.data.kline import FEATURE_COLUMNS
from kronos_core.launch import EVENT_PREFIX, LaunchSpec, run_launch, torchrun_command
from kronos_tune.cli import main
from machine import process_gone


def test_torchrun_command_for_one_node_and_several():
    one = torchrun_command(LaunchSpec(nproc=2), "pkg.mod", ["job.json"], python="py")
    assert one == ["py", "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "0",
                   "--standalone", "-m", "pkg.mod", "job.json"]
    many = torchrun_command(LaunchSpec(nproc=4, nnodes="2", node_rank=1, rdzv_endpoint="host:29400"), "m", [])
    assert many[many.index("--nnodes") + 1] == "2" and many[many.index("--node-rank") + 1] == "1"
    assert "--standalone" not in many and many[many.index("--rdzv-endpoint") + 1] == "host:29400"
    with pytest.raises(Exception, match="needs --rdzv-endpoint"):
        torchrun_command(LaunchSpec(nproc=1, nnodes="2"), "m", [])
    restarting = torchrun_command(LaunchSpec(nproc=2, max_restarts=3), "m", [])
    assert restarting[restarting.index("--max-restarts") + 1] == "3"  # predict --max-restarts passes through


def test_launcher_streams_events_and_a_stop_file_stops_the_whole_group(tmp_path: Path):
    stop = tmp_path / "STOP"
    pid_file = tmp_path / "child.pid"
    script = (  # a parent and a grandchild that both sleep: the stop must reach the whole session
        "import os, subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        f"print({EVENT_PREFIX!r} + '{{\"event\": \"ready\"}}', flush=True)\n"
        "print('plain line', flush=True)\n"
        "time.sleep(120)\n"
    )
    events, lines = [], []

    def on_line(line):
        lines.append(line)
        stop.touch()

    result = run_launch([sys.executable, "-c", script], on_event=events.append, on_line=on_line, stop_file=stop,
                        grace_s=5)
    assert result.stopped and not result.ok and result.returncode != 0
    assert events == [{"event": "ready"}] and "plain line" in lines
    assert process_gone(int(pid_file.read_text()))  # the grandchild is gone too


def _predict(capsys, out: Path, *extra: object) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["predict", "--device", "cpu", "--size", "tiny", "--synthetic", 4, "--lookback", 48, "--pred-len", 4,
              "--top-k", 1, "--max-batch-size", 2, "--out", out, "--json", *map(str, extra)])
    assert caught.value.code == 0, capsys.readouterr().err
    capsys.readouterr()


@pytest.mark.slow
def test_two_gloo_ranks_predict_what_one_process_predicts(tmp_path: Path, capsys):
    # --max-batch-size 2: one process runs the same two blocks of two series the two ranks run
    _predict(capsys, tmp_path / "one.parquet")
    _predict(capsys, tmp_path / "two.parquet", "--nproc", 2)
    one, two = pd.read_parquet(tmp_path / "one.parquet"), pd.read_parquet(tmp_path / "two.parquet")
    assert list(two["series"]) == list(one["series"]) and list(two["timestamps"]) == list(one["timestamps"])
    np.testing.assert_array_equal(two[list(FEATURE_COLUMNS)].to_numpy(), one[list(FEATURE_COLUMNS)].to_numpy())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.parquet", "two.parquet"]


@pytest.mark.slow
def test_benchmark_sharding_trial_runs_the_claiming_ranks_and_matches_one_process():
    """The sharding trial times predict's ranks (two chunks of two series, claimed by two gloo ranks): its
    greedy and sampled outputs over the quality set (6 series, the 4 timed ones first) equal the one-process
    trial's, value for value."""
    from kronos_tune.benchmark.predict.measure import measure_prediction
    from kronos_tune.benchmark.results import PredictSettings

    one = PredictSettings("tiny", lookback=32, pred_len=3, sample_count=1, series_count=100, measured_series=4,
                          max_batch_size=2, agreement_series=6, chunk_series=2)
    steps = []
    sharded = measure_prediction(dataclasses.replace(one, devices=2), "cpu", 2**34, repeats=1, on_step=steps.append)
    single = measure_prediction(one, "cpu", 2**34, repeats=1)
    assert sharded.status == "ok", sharded.reason
    assert len(sharded.seconds) == 1 and sharded.metered_time_s > 0
    assert [(s.timed, s.series) for s in steps] == [(False, 4), (True, 4), (False, 6)]  # metered, timed, quality
    assert len(sharded.outputs) == len(sharded.sampled_outputs) == len(single.outputs) == 6
    for mine, theirs in ((sharded.outputs, single.outputs), (sharded.sampled_outputs, single.sampled_outputs)):
        for a, b in zip(mine, theirs):
            np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
            assert list(a.index) == list(b.index)
    greedy = np.stack([f.to_numpy() for f in single.outputs])
    sampled = np.stack([f.to_numpy() for f in single.sampled_outputs])
    assert not np.array_equal(greedy, sampled)  # the sampled pass decodes as predict does, not greedily
