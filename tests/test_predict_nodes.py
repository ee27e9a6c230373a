"""`kronos-tune predict` across two nodes for real: two agents on this machine meet at a c10d rendezvous on
loopback (`--nnodes 2 --nproc 1`), each reads the same panel, both give the same --out (its work folder is
the storage the nodes share), the node that hosts rank 0 writes the output, and it equals one process's; an
agent killed mid-run leaves no --out, and the survivor names the work folder that keeps the finished
chunks."""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kronos_core.data.kline import FEATURE_COLUMNS
from kronos_core.launch import kill_tree
from kronos_tune.cli import main
from machine import process_gone
from test_real_panels import write_sp500_like

pytestmark = pytest.mark.slow

# 4 symbols: 2 per rank. --top-k 1 (greedy) and --max-batch-size 2: one process runs the same two batches the
# two ranks run, so the CPU matmuls round alike and the outputs are equal bit for bit.
PREDICT = ("predict", "--size", "tiny", "--device", "cpu", "--top-k", "1", "--lookback", "30", "--pred-len", "3",
           "--max-batch-size", "2", "--symbol-column", "Symbol", "--json")
SYMBOLS = (("AAA", 60, "2010-08-20"), ("BBB", 50, "2010-08-20"), ("CCC", 55, "2010-08-13"), ("DDD", 40, "2010-07-02"))
AGENT_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Agent:
    """One node: `kronos-tune predict --nnodes 2 --nproc 1` in its own session, its stderr read line by line."""

    def __init__(self, panel: Path, out: Path, port: int, name: str, *extra: str) -> None:
        self.tmp = out.with_name(f"{name}-tmp")  # anything it puts in TMPDIR goes here, not into /tmp
        self.tmp.mkdir()
        command = [sys.executable, "-m", "kronos_tune.cli", *PREDICT, "--data", str(panel), "--out", str(out),
                   "--nproc", "1", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                   "--rdzv-id", f"kronos-predict-{port}", *extra]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TMPDIR=str(self.tmp))
        env.pop("WORLD_SIZE", None)
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.err: list[str] = []
        self.out: list[str] = []
        self.readers = [threading.Thread(target=self._read_err, daemon=True),
                        threading.Thread(target=lambda: self.out.extend(self.process.stdout), daemon=True)]
        for reader in self.readers:
            reader.start()

    def _read_err(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.err.append(line)
            self.lines.put(line)

    def wait_for(self, text: str, timeout_s: float = AGENT_TIMEOUT_S) -> None:
        while True:
            try:
                line = self.lines.get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(f"no '{text}' from the agent: {''.join(self.err)[-2000:]}") from None
            if text in line:
                return

    def finish(self) -> tuple[int, str, str]:
        try:
            self.process.wait(timeout=AGENT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_tree(self.process.pid)
            raise AssertionError(f"agent hung: {''.join(self.err)[-2000:]}") from None
        for reader in self.readers:
            reader.join(timeout=30)
        return self.process.returncode, "".join(self.out), "".join(self.err)

    def kill(self) -> None:
        """The whole node at once: the agent, its torchrun and the rank (a machine that dies)."""
        kill_tree(self.process.pid)


def wait_until(condition, timeout_s: float = AGENT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not true after {timeout_s} s")
        time.sleep(0.02)


def features(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path)


def test_two_agents_predict_what_one_process_predicts(tmp_path: Path, capsys):
    panel = tmp_path / "panel.csv"
    write_sp500_like(panel, shorts=1, full=SYMBOLS)
    with pytest.raises(SystemExit) as caught:
        main([*PREDICT, "--data", str(panel), "--out", str(tmp_path / "one.parquet")])
    assert caught.value.code == 0, capsys.readouterr().err
    capsys.readouterr()

    port = free_port()
    shared = tmp_path / "two.parquet"
    agents = [Agent(panel, shared, port, name) for name in ("node_a", "node_b")]
    results = [agent.finish() for agent in agents]
    for code, _, err in results:
        assert code == 0, err[-3000:]
        assert "rendezvous done: rank" in err and "of 2 ready on this node" in err
    assert not (tmp_path / "two.parquet.work").exists()  # gone after success
    writers = ["the node running rank 0 writes the output" not in err for _, _, err in results]
    assert sorted(writers) == [False, True]  # the node hosting rank 0 writes; the other says so
    one, two = features(tmp_path / "one.parquet"), features(shared)
    assert list(two["Symbol"]) == list(one["Symbol"]) and sorted(set(one["Symbol"])) == ["AAA", "BBB", "CCC", "DDD"]
    assert list(two["timestamps"]) == list(one["timestamps"])
    np.testing.assert_array_equal(two[list(FEATURE_COLUMNS)].to_numpy(), one[list(FEATURE_COLUMNS)].to_numpy())


def test_a_node_killed_mid_run_leaves_no_complete_looking_file(tmp_path: Path):
    panel = tmp_path / "panel.csv"
    write_sp500_like(panel, shorts=0, full=SYMBOLS)
    port = free_port()
    shared = tmp_path / "out.parquet"
    # Many sample paths, one at a time, in chunks of one series: the ranks are surely still predicting when the
    # node dies.
    slow = ("--sample-count", "400", "--max-batch-size", "1", "--chunk-series", "1")
    survivor = Agent(panel, shared, port, "survivor", *slow)
    doomed = Agent(panel, shared, port, "killed", *slow)
    try:
        survivor.wait_for("rendezvous done")
        doomed.wait_for("rendezvous done")
        # a chunk finished, so there is something to keep (a kill before the first leaves nothing: kept_note)
        wait_until(lambda: any((tmp_path / "out.parquet.work" / "done").glob("chunk-*.json")))
    except AssertionError:
        survivor.kill()
        doomed.kill()
        raise
    doomed.kill()
    assert process_gone(doomed.process.pid)
    code, out, err = survivor.finish()
    assert code == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    # the survivor's rank sees its peer fail, or, where the killed node's agent hosted the rendezvous store (the
    # first to bind the endpoint), the survivor's agent loses the store: both end the same way
    assert last.startswith(("error: predict --nproc 1 --nnodes 2: rank ",
                            "error: predict --nproc 1 --nnodes 2: torchrun exited with code 1: the connection to "
                            "the rendezvous store was lost")), err
    assert f"the finished chunks are kept in {tmp_path / 'out.parquet.work'}; run the same command with --resume" \
        in last
    assert "Traceback" not in err + out
    # No output; the shared work folder keeps what the ranks finished.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["killed-tmp", "out.parquet.work", "panel.csv",
                                                          "survivor-tmp"]
