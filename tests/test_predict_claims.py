"""Large `predict --out` jobs across processes, for real: a job killed with SIGKILL leaves no --out and its
finished chunks, and --resume completes it identically; two gloo ranks claim chunks by speed (one made 4x
slower through benchmarks.planted_ranks) and write what one process writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from kronos_core.launch import kill_tree
from kronos_tune.cli import main
from benchmarks.planted_ranks import SLOW_RANK_KNOB
from test_predict_large import write_panel

pytestmark = pytest.mark.slow

ARGS = ("predict", "--size", "tiny", "--device", "cpu", "--lookback", "24", "--pred-len", "2", "--sample-count", "2",
        "--symbol-column", "code", "--chunk-series", "2")
TIMEOUT_S = 240


def run_here(capsys, *args: object) -> dict:
    with pytest.raises(SystemExit) as caught:
        main([*ARGS, *map(str, args), "--json"])
    out, err = capsys.readouterr()
    assert caught.value.code == 0, err
    return json.loads(out)


def start(*args: object, env: dict | None = None, entry: str = "kronos_tune.cli") -> subprocess.Popen:
    """The command in a process of its own; `entry` benchmarks.planted_ranks: the CLI with planted ranks."""
    return subprocess.Popen([sys.executable, "-m", entry, *ARGS, *map(str, args), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def wait_for(condition, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            kill_tree(process.pid)
            raise AssertionError(f"never saw {what}: {process.communicate()[1][-2000:]}")
        time.sleep(0.05)


def test_a_killed_job_keeps_its_chunks_and_resumes_to_the_same_output(tmp_path: Path, capsys) -> None:
    write_panel(tmp_path / "panel.parquet", 12)
    run_here(capsys, "--data", tmp_path / "panel.parquet", "--out", tmp_path / "full.csv")
    out = tmp_path / "cut.csv"
    done = tmp_path / "cut.csv.work" / "done"
    process = start("--data", tmp_path / "panel.parquet", "--out", out)
    wait_for(lambda: done.is_dir() and len(list(done.glob("chunk-*.json"))) >= 2, process, "two finished chunks")
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    kept = len(list(done.glob("chunk-*.json")))  # a record being written is a hidden temp (.chunk-...tmp.json)
    assert not out.exists() and 2 <= kept < 6
    report = run_here(capsys, "--data", tmp_path / "panel.parquet", "--out", out, "--resume")
    assert report["job"]["resumed_chunks"] >= kept and report["series"] == 12
    assert out.read_bytes() == (tmp_path / "full.csv").read_bytes()


def test_two_ranks_claim_chunks_by_speed_and_write_what_one_process_writes(tmp_path: Path, capsys) -> None:
    write_panel(tmp_path / "panel.parquet", 16)
    run_here(capsys, "--data", tmp_path / "panel.parquet", "--out", tmp_path / "one.parquet")
    process = start("--data", tmp_path / "panel.parquet", "--out", tmp_path / "two.parquet", "--nproc", "2",
                    env={SLOW_RANK_KNOB: "1:4"}, entry="benchmarks.planted_ranks")
    stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    assert process.returncode == 0, stderr[-3000:]
    ranks = json.loads(stdout)["job"]["ranks"]
    assert set(ranks) == {"0", "1"} and ranks["0"]["chunks"] + ranks["1"]["chunks"] == 8
    assert ranks["0"]["chunks"] > ranks["1"]["chunks"]  # the slow rank took fewer chunks
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "two.parquet"), pd.read_parquet(tmp_path / "one.parquet"))
