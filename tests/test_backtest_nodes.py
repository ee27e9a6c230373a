"""`kronos-tune backtest --nnodes 2` for real: two agents on this machine meet at a c10d rendezvous on loopback,
both given the same --out (the run folder the nodes share), their ranks claim the chunks of both settings
(--compare), each setting's origin files are written by the node that ran its rank 0, the node that ran the
last one's scores the run, the other says so and exits 0, and the run's
backtest.json and origins.csv are the bytes one process writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_predict_nodes import free_port

pytestmark = pytest.mark.slow

# Greedy tokens and 2 symbol-origins a chunk: one process runs the same batches the ranks run, so the CPU
# matrix products round alike and the files are equal bit for bit.
BACKTEST = ("backtest", "--size", "tiny", "--device", "cpu", "--lookback", "32", "--pred-len", "4", "--synthetic", "6",
            "--origins", "4", "--top-k", "2", "--sample-top-k", "1", "--chunk-series", "2", "--compare", "shift",
            "--json")
TIMEOUT_S = 300


def _env(tmp: Path) -> dict[str, str]:
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TMPDIR=str(tmp))
    env.pop("WORLD_SIZE", None)
    return env


def _files(run: Path) -> bytes:
    return (run / "backtest.json").read_bytes() + (run / "origins.csv").read_bytes()


def test_two_nodes_share_the_chunks_and_one_scores_the_run(tmp_path: Path) -> None:
    one = subprocess.run([sys.executable, "-m", "kronos_tune.cli", *BACKTEST, "--out", str(tmp_path / "one")],
                         capture_output=True, text=True, env=_env(tmp_path / "one-tmp"), timeout=TIMEOUT_S)
    assert one.returncode == 0, one.stderr[-2000:]

    shared, port = tmp_path / "shared", free_port()
    agents = [subprocess.Popen([sys.executable, "-m", "kronos_tune.cli", *BACKTEST, "--out", str(shared),
                                "--nproc", "1", "--nnodes", "2", "--rdzv-backend", "c10d",
                                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"kronos-backtest-{port}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=_env(tmp_path / f"node{i}-tmp"), start_new_session=True) for i in range(2)]
    finished = [agent.communicate(timeout=TIMEOUT_S) for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], [err[-2000:] for _, err in finished]

    scorers = [i for i, (out, _) in enumerate(finished) if out.strip()]
    assert len(scorers) == 1  # one node printed backtest.json: the one that ran rank 0
    other = 1 - scorers[0]
    assert finished[other][0] == ""
    assert "this node's ranks are done; the node that ran the last rank 0 scores the run in" in finished[other][1]
    assert json.loads(finished[scorers[0]][0])["symbols"] == 6
    assert _files(shared) == _files(tmp_path / "one")
    run = json.loads((shared / "run.json").read_text(encoding="utf-8"))
    assert run["status"] == "complete"
    assert sum(r["chunks"] for r in run["ranks_a"].values()) == 12  # the ranks of both nodes, by speed
    assert not (shared / "predictions" / "a.work").exists() and not (shared / "predictions" / "b.work").exists()
