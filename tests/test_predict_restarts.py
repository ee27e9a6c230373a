"""A sharded `predict --out` job whose rank dies, for real (torchrun, two gloo ranks, tiny model): with
`--max-restarts 1` torchrun starts the group again and it continues from the finished chunks, writing what
one process writes; with `--max-restarts 0` the same death stops the job in one line and keeps the finished
chunks for `--resume`. The death is planted from outside the product (benchmarks.planted_ranks:
rank 1 kills itself with SIGKILL on the first attempt, after one finished chunk, holding a claimed one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kronos_core.launch import kill_tree
from kronos_tune.predict.config import PredictConfig
from kronos_tune.predict.job import run_predict
from benchmarks.planted_ranks import DIE_RANK_KNOB
from test_predict_large import write_panel

pytestmark = pytest.mark.slow

SERIES, CHUNK_SERIES = 40, 4
CHUNKS = SERIES // CHUNK_SERIES
BASE = dict(lookback=24, pred_len=2, size="tiny", device="cpu", symbol_column="code", chunk_series=CHUNK_SERIES)
TIMEOUT_S = 300  # a hang (the restarted group waiting on the old attempt's addresses) fails the test

# The job in a process of its own (so a hang can be killed): every chunk event the parent sees (as the job's
# progress hook reports it) and the notes, then the job's report or its one-line error.
DRIVER = r"""
import json, sys
from pathlib import Path
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.config import PredictConfig
from kronos_tune.predict.job import run_predict
from benchmarks.planted_ranks import use_planted_ranks

use_planted_ranks()  # the ranks are planted by benchmarks.planted_ranks, which reads the planted death
settings = json.loads(sys.argv[1])
settings["data"], settings["out"] = (Path(settings["data"]),), Path(settings["out"])
seen = {"reports": [], "notes": []}
try:
    result = run_predict(PredictConfig(**settings), on_note=lambda level, text: seen["notes"].append(text),
                         on_job_progress=lambda report: seen["reports"].append(report.series_done))
    seen["job"] = result.job
except KronosTuneError as error:
    seen["error"] = str(error)
print(json.dumps(seen))
"""


def run_job(**settings) -> dict:
    """The job with rank 1 dying on the first attempt; what the parent saw."""
    settings = {**BASE, **settings}
    settings.update(data=str(settings["data"]), out=str(settings["out"]))
    process = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(settings)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1", DIE_RANK_KNOB: "1:1"})
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)
        stdout, stderr = process.communicate()
        raise AssertionError(f"the job hung for {TIMEOUT_S} s: {stderr[-3000:]}") from None
    assert process.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def one_process(data: Path, out: Path, **settings) -> None:
    run_predict(PredictConfig(**{**BASE, **settings, "data": (data,), "out": out}))


def test_a_restarted_group_continues_from_the_finished_chunks(tmp_path: Path) -> None:
    """Default sampling (T 1, top-p 0.9): the restarted group's output equals one process's, value for value."""
    write_panel(tmp_path / "panel.parquet", SERIES)
    one_process(tmp_path / "panel.parquet", tmp_path / "one.csv")
    seen = run_job(data=tmp_path / "panel.parquet", out=tmp_path / "two.csv", nproc=2, max_restarts=1)
    assert "error" not in seen, seen.get("error")
    restarted = [n for n in seen["notes"] if n.startswith("torchrun restarted the ranks")]
    assert len(restarted) == 1 and "restart 1 of 1" in restarted[0], seen["notes"]
    left = int(restarted[0].split("continue with the ")[1].split()[0])
    assert 1 <= left <= CHUNKS - 1  # rank 1's finished chunk (at least) was kept, not started over
    # one chunk event per chunk over both attempts: no finished chunk was predicted again, the lost one was redone
    assert len(seen["reports"]) == CHUNKS and seen["reports"][-1] == SERIES
    ranks = seen["job"]["ranks"]  # from the records: which rank finished which chunk
    assert sum(r["chunks"] for r in ranks.values()) == CHUNKS and ranks["1"]["chunks"] >= 1
    assert seen["job"]["resumed_chunks"] == 0
    assert (tmp_path / "two.csv").read_bytes() == (tmp_path / "one.csv").read_bytes()
    assert not (tmp_path / "two.csv.work").exists()


def test_without_restarts_a_dead_rank_stops_the_job_and_resume_finishes_it(tmp_path: Path) -> None:
    """Greedy: the death stops every rank with one line naming the rank; the finished chunks stay, and
    --resume predicts only the rest and writes what one process writes."""
    write_panel(tmp_path / "panel.parquet", SERIES)
    one_process(tmp_path / "panel.parquet", tmp_path / "one.csv", top_k=1)
    out = tmp_path / "two.csv"
    seen = run_job(data=tmp_path / "panel.parquet", out=out, nproc=2, top_k=1)
    error = seen.get("error", "")
    assert "\n" not in error and error.startswith("predict --nproc 2: rank 1 was killed by SIGKILL"), error
    assert error.endswith(f"the finished chunks are kept in {out}.work; run the same command with --resume to "
                          f"finish"), error
    kept = len(list((tmp_path / "two.csv.work" / "done").glob("chunk-*.json")))
    assert kept == len(seen["reports"]) and 1 <= kept < CHUNKS  # every chunk event has its record, and back
    assert not out.exists()
    resumed = run_predict(PredictConfig(**{**BASE, "data": (tmp_path / "panel.parquet",), "out": out, "top_k": 1,
                                           "resume": True}))
    assert resumed.job["resumed_chunks"] == kept
    assert out.read_bytes() == (tmp_path / "one.csv").read_bytes()
