"""`kronos-tune predict --runner ray`: the chunk pipeline on Ray Data actors, for real (a local Ray on this
machine, the tiny model): the same bytes as one process, a killed actor restarted by Ray, an actor's error
stopping the run in one line that keeps the finished chunks, a killed driver and `--resume`. The deaths and
errors are planted from here: `ray_runner.ChunkWorker` is replaced by a subclass made in this file (pickled by
value into the actors) that wraps `predict_chunk` in the actor's process; the product plants nothing. The bad-input lines (Ray missing, a cluster that does not answer, the flags) need no Ray running."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kronos_core.launch import kill_tree
from kronos_tune.cli import main
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict import ray_runner
from kronos_tune.predict.config import PredictConfig
from kronos_tune.predict.job import run_predict
from kronos_tune.predict.workdir import work_folder_for

HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason='Ray is not installed (pip install "kronos-tune[ray]")')

SERIES, CHUNK_SERIES = 48, 4
DRIVER_SERIES = 400  # enough chunks that the driver is still running when the first one is finished
FLAGS = ["--size", "tiny", "--device", "cpu", "--synthetic", str(SERIES), "--lookback", "32", "--pred-len", "4",
         "--chunk-series", str(CHUNK_SERIES)]
CONFIG = dict(size="tiny", device="cpu", synthetic=SERIES, lookback=32, pred_len=4, chunk_series=CHUNK_SERIES)
CLI = [sys.executable, "-m", "kronos_tune.cli", "predict"]
TIMEOUT_S = 300


def _error(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(["predict", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # free once the socket is closed: nothing listens there


# Bad input -----------------------------------------------------------------------------------------------


def test_ray_missing_is_one_line_with_the_install_command(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without Ray gives: ImportError
    monkeypatch.setitem(sys.modules, "ray.data", None)
    out = tmp_path / "f.parquet"
    err = _error([*FLAGS, "--runner", "ray", "--out", str(out)], capsys)
    assert 'pip install "kronos-tune[ray]"' in err
    assert not out.exists() and not work_folder_for(out).exists()


@needs_ray
def test_an_unreachable_cluster_is_one_line_and_loses_nothing(tmp_path: Path, capsys) -> None:
    out = tmp_path / "f.parquet"
    out.write_bytes(b"an earlier run's forecasts")
    for address in ("127.0.0.1:1", f"127.0.0.1:{_closed_port()}", f"ray://127.0.0.1:{_closed_port()}"):
        err = _error([*FLAGS, "--runner", "ray", "--ray-address", address, "--out", str(out)], capsys)
        assert f"--ray-address {address}: no Ray cluster answers there" in err
    assert out.read_bytes() == b"an earlier run's forecasts"
    assert not work_folder_for(out).exists()
    assert "give HOST:PORT" in _error([*FLAGS, "--runner", "ray", "--ray-address", "headnode"], capsys)


def test_ray_flags_are_checked_before_any_work(capsys) -> None:
    assert "--ray-actors 2 applies to --runner ray" in _error([*FLAGS, "--ray-actors", "2"], capsys)
    assert "--ray-address 127.0.0.1:1 applies to --runner ray" in _error([*FLAGS, "--ray-address", "127.0.0.1:1"],
                                                                        capsys)
    assert "--runner spark: choose one of torchrun, ray" in _error([*FLAGS, "--runner", "spark"], capsys)
    assert "Ray places its actors itself" in _error([*FLAGS, "--runner", "ray", "--nproc", "2"], capsys)
    assert "--ray-actors 0: must be at least 1" in _error([*FLAGS, "--runner", "ray", "--ray-actors", "0"], capsys)


# Real runs on a local Ray ----------------------------------------------------------------------------------


def _one_process(flags: list[str], out: Path) -> bytes:
    """The --out bytes of the job in one process (default sampling: T 1, top-p 0.9)."""
    done = subprocess.run([*CLI, *flags, "--out", str(out)], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    return out.read_bytes()


@pytest.fixture
def reference(tmp_path: Path) -> bytes:
    return _one_process(FLAGS, tmp_path / "one.parquet")


@pytest.fixture
def local_ray():
    """A Ray on this machine for the test (two CPUs: two actors), shut down after it."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def _planted_workers(before_chunk):
    """ChunkWorker whose actors call `before_chunk(finished_here)` before predicting each chunk, inside the
    actor's own error handling (its process's `predict_chunk` wrapped). Made in a function, so that Ray pickles
    the class by value and the actors need not import this file."""

    class PlantedWorker(ray_runner.ChunkWorker):
        def __init__(self, job: dict, numbers) -> None:
            super().__init__(job, numbers)
            from kronos_tune.predict import chunk_run

            predict, finished = chunk_run.predict_chunk, [0]

            def planted(*args, **kwargs):
                before_chunk(finished[0])
                done = predict(*args, **kwargs)
                finished[0] += 1
                return done

            chunk_run.predict_chunk = planted

    return PlantedWorker


def _dies_once(flag: Path, after: int):
    """The first actor to have finished `after` chunks SIGKILLs itself, holding its next chunk (once over the
    run: the flag file says it happened)."""
    def before_chunk(finished_here: int) -> None:
        if finished_here >= after and not flag.exists():
            flag.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
    return _planted_workers(before_chunk)


def _fails_after(after: int):
    def before_chunk(finished_here: int) -> None:
        if finished_here >= after:
            raise RuntimeError("planted failure")
    return _planted_workers(before_chunk)


@needs_ray
@pytest.mark.slow
def test_ray_writes_the_bytes_one_process_writes(tmp_path: Path, reference: bytes) -> None:
    out = tmp_path / "ray.parquet"
    done = subprocess.run([*CLI, *FLAGS, "--out", str(out), "--runner", "ray", "--ray-address", "local", "--json"],
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.read_bytes() == reference
    report = json.loads(done.stdout)
    assert report["series"] == SERIES and report["job"]["chunks"] == SERIES // CHUNK_SERIES
    assert sum(item["chunks"] for item in report["job"]["ranks"].values()) == SERIES // CHUNK_SERIES
    assert "predicted by 2 Ray actors" in done.stderr
    assert not work_folder_for(out).exists()


@needs_ray
@pytest.mark.slow
def test_a_killed_actor_is_restarted_and_its_chunk_predicted_again(tmp_path: Path, reference: bytes, local_ray,
                                                                   monkeypatch) -> None:
    flag = tmp_path / "killed"
    monkeypatch.setattr(ray_runner, "ChunkWorker", _dies_once(flag, after=1))
    out = tmp_path / "ray.parquet"
    result = run_predict(PredictConfig(**CONFIG, out=out, runner="ray"))
    assert flag.exists()  # an actor did die, holding a chunk
    assert out.read_bytes() == reference
    assert max(int(rank) for rank in result.job["ranks"]) >= 2  # the restarted actor took the next number


@needs_ray
@pytest.mark.slow
def test_an_actor_error_stops_the_run_and_resume_finishes_it(tmp_path: Path, reference: bytes, local_ray,
                                                            monkeypatch) -> None:
    plain = ray_runner.ChunkWorker
    monkeypatch.setattr(ray_runner, "ChunkWorker", _fails_after(1))
    out = tmp_path / "ray.parquet"
    with pytest.raises(KronosTuneError) as info:
        run_predict(PredictConfig(**CONFIG, out=out, runner="ray"))
    message = str(info.value)
    assert "\n" not in message
    assert re.search(r"predict --runner ray: actor \d+ failed on chunk \d+: RuntimeError: planted failure", message)
    assert "the finished chunks are kept in" in message and "--resume" in message
    kept = len(list((work_folder_for(out) / "done").glob("chunk-*.json")))
    assert 1 <= kept < SERIES // CHUNK_SERIES and not out.exists()

    monkeypatch.setattr(ray_runner, "ChunkWorker", plain)
    notes: list[str] = []
    result = run_predict(PredictConfig(**CONFIG, out=out, runner="ray", resume=True),
                         on_note=lambda level, text: notes.append(text))
    assert out.read_bytes() == reference
    assert result.resumed_series == kept * CHUNK_SERIES
    assert any(text.startswith(f"resumed: kept {kept} of {SERIES // CHUNK_SERIES} chunks") for text in notes)


@needs_ray
@pytest.mark.slow
def test_a_killed_driver_resumes_from_the_done_records(tmp_path: Path) -> None:
    flags = [*FLAGS]
    flags[flags.index("--synthetic") + 1] = str(DRIVER_SERIES)
    reference = _one_process(flags, tmp_path / "one.parquet")
    chunks = DRIVER_SERIES // CHUNK_SERIES
    out = tmp_path / "ray.parquet"
    done_folder = work_folder_for(out) / "done"
    command = [*CLI, *flags, "--out", str(out), "--runner", "ray", "--ray-address", "local"]
    driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not any(done_folder.glob("chunk-*.json")) and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert driver.poll() is None, "the run ended before the driver could be killed"
        os.kill(driver.pid, signal.SIGKILL)  # the driver alone: its Ray goes down without it
        driver.wait(timeout=30)
    finally:
        time.sleep(2)
        kill_tree(driver.pid)  # what the killed driver's Ray leaves running on this machine
        driver.stderr.close()
    assert not out.exists()
    kept = len(list(done_folder.glob("chunk-*.json")))
    assert 1 <= kept < chunks

    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert out.read_bytes() == reference
    assert f"resumed: kept {kept} of {chunks} chunks" in resumed.stdout + resumed.stderr
