"""The backtest through the prediction pipeline: chunks of (symbol, origin) windows, their size, resume after
kill -9, claiming ranks, and the runs of an earlier layout refused in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kronos_tune.backtest.config import BacktestConfig, PredictionSetting
from kronos_tune.backtest.runner import run_backtest
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.chunk_size import CHUNKS_PER_PROCESS, choose_chunk_series, describe_chunks

TINY = dict(size="tiny", lookback=32, pred_len=4, device="cpu")


def _quiet(level: str, message: str) -> None:
    pass


def _outputs(run: Path) -> dict[str, bytes]:
    files = [run / "backtest.json", run / "origins.csv", *sorted((run / "predictions").rglob("origin-*.csv"))]
    return {str(path.relative_to(run)): path.read_bytes() for path in files}


def test_chunk_size_is_chosen_from_the_job():
    # enough chunks per process that a stop keeps work and ranks share it ...
    assert choose_chunk_series(481, 1, "cpu") == 61 and -(-481 // 61) == CHUNKS_PER_PROCESS
    assert choose_chunk_series(481, 2, "cpu") == 31
    # ... no chunk larger than one predict call (256 sequences on the CPU), fewer series with more paths ...
    assert choose_chunk_series(200_000, 1, "cpu") == 256
    assert choose_chunk_series(200_000, 1, "cpu", sample_count=8) == 32
    assert choose_chunk_series(200_000, 1, "cuda") == 8192  # the predictor's one CUDA cap
    # ... or one call of --max-batch-size sequences when given
    assert choose_chunk_series(200_000, 1, "cpu", max_batch_size=64) == 64
    assert choose_chunk_series(200_000, 1, "cuda", sample_count=8, max_batch_size=64) == 8
    # ... and not tiny chunks for a small job
    assert choose_chunk_series(30, 1, "cpu") == 16 and choose_chunk_series(5, 4, "cpu") == 5
    assert describe_chunks(61, 481, 1, chosen=True).startswith("chunks of 61 series: 8 chunks (chosen from the job")
    assert "about 8 per process" in describe_chunks(31, 481, 2, chosen=True)


def test_the_processes_sharing_a_predict_job_are_its_ranks_or_its_ray_actors():
    from kronos_tune.predict.config import PredictConfig
    from kronos_tune.predict.large import job_processes

    job = dict(lookback=32, pred_len=4, synthetic=481)
    assert job_processes(PredictConfig(**job)) == 1
    assert job_processes(PredictConfig(**job, nproc=2)) == 2
    assert job_processes(PredictConfig(**job, runner="ray", ray_actors=4)) == 4
    assert job_processes(PredictConfig(**job, runner="ray")) == 1  # a pool sized by the cluster: unknown before Ray


def test_the_chunk_size_does_not_change_a_sampled_backtest(tmp_path: Path, one_thread):
    # T = 1 and two sample paths: every window draws from its own stream, whatever chunk it lands in
    options = dict(**TINY, synthetic=9, origins=4, top_k=2, setting=PredictionSetting(sample_count=2))
    notes: list[str] = []
    run_backtest(BacktestConfig(**options, out=tmp_path / "auto"), on_note=lambda level, text: notes.append(text))
    run_backtest(BacktestConfig(**options, chunk_series=7, out=tmp_path / "seven"), on_note=_quiet)
    assert _outputs(tmp_path / "auto") == _outputs(tmp_path / "seven")
    assert any("chunks of 16 symbol-origins: 3 chunks (chosen from the job" in note for note in notes)
    assert any("symbol-origins/s on the first chunk: about" in note for note in notes)


def test_a_run_of_an_earlier_build_is_refused_in_one_line(tmp_path: Path, one_thread):
    options = dict(**TINY, synthetic=6, origins=2, top_k=2)
    run_backtest(BacktestConfig(**options, out=tmp_path / "run"), on_note=_quiet)
    run_file = tmp_path / "run" / "run.json"
    data = json.loads(run_file.read_text())
    del data["format"]  # as a build before run formats wrote it
    run_file.write_text(json.dumps(data))
    before = _outputs(tmp_path / "run")
    with pytest.raises(KronosTuneError) as caught:
        run_backtest(BacktestConfig(**options, out=tmp_path / "run", resume=True), on_note=_quiet)
    message = str(caught.value)
    assert "\n" not in message and "an earlier build of kronos-tune wrote that run" in message
    assert "--overwrite or another --out" in message
    assert _outputs(tmp_path / "run") == before  # nothing written lost


def test_a_resumed_slot_with_other_settings_names_what_differs(tmp_path: Path, one_thread):
    options = dict(**TINY, synthetic=6, origins=3, top_k=2, chunk_series=6)

    def stop_after_first_origin(state) -> None:
        if state.origins_done >= 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_backtest(BacktestConfig(**options, out=tmp_path / "run"), on_note=_quiet,
                     on_progress=stop_after_first_origin)
    work = tmp_path / "run" / "predictions" / "a.work"
    manifest = json.loads((work / "manifest.json").read_text())
    manifest["identity"]["draws"] = "an older stream layout"  # what a code change to the draws leaves behind
    (work / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(KronosTuneError) as caught:
        run_backtest(BacktestConfig(**options, out=tmp_path / "run", resume=True), on_note=_quiet)
    message = str(caught.value)
    assert "\n" not in message and "draws: \"an older stream layout\" there" in message
    assert len(list((work / "done").glob("chunk-*.json"))) == 1  # the finished chunk is kept


def _backtest(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kronos_tune.cli", "backtest", "--size", "tiny", "--lookback", "32", "--pred-len",
            "4", "--synthetic", "40", "--origins", "12", "--top-k", "4", "--device", "cpu", "--sample-count", "2",
            "--json", "--out", str(out), *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_two_ranks_give_the_bytes_of_one_process(tmp_path: Path):
    for name, extra in (("one", ()), ("two", ("--nproc", "2"))):
        done = subprocess.run(_backtest(tmp_path / name, *extra), capture_output=True, text=True, env=_env(),
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    assert "chunks claimed by speed" in done.stderr
    assert _outputs(tmp_path / "one") == _outputs(tmp_path / "two")


@pytest.mark.slow
def test_kill_9_then_resume_gives_the_same_backtest(tmp_path: Path):
    whole = subprocess.run(_backtest(tmp_path / "whole", "--chunk-series", "8"), capture_output=True, text=True,
                           env=_env(), timeout=600)
    assert whole.returncode == 0, whole.stderr[-2000:]
    cut = tmp_path / "cut"
    process = subprocess.Popen(_backtest(cut, "--chunk-series", "8"), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=_env())
    done = cut / "predictions" / "a.work" / "done"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if done.is_dir() and len(list(done.glob("chunk-*.json"))) >= 3:
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    kept = len(list(done.glob("chunk-*.json")))
    assert 3 <= kept < 60 and not (cut / "backtest.json").exists()
    resumed = subprocess.run(_backtest(cut, "--chunk-series", "8", "--resume"), capture_output=True, text=True,
                             env=_env(), timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed: {kept} of 60 chunks" in resumed.stderr
    assert _outputs(cut) == _outputs(tmp_path / "whole")


def test_several_nodes_need_a_rendezvous_and_a_shared_out_before_anything_is_written(tmp_path: Path, capsys):
    from cli_errors import one_line_error

    flags = ["backtest", "--size", "tiny", "--synthetic", "6", "--lookback", "32", "--pred-len", "4", "--top-k", "2",
             "--nnodes", "2"]
    assert one_line_error([*flags, "--out", str(tmp_path / "run")], capsys).startswith(
        "error: --nnodes 2 needs --rdzv-endpoint HOST:PORT")
    assert "--nnodes 2 needs --out DIR on storage every node shares" in one_line_error(
        [*flags, "--rdzv-endpoint", "127.0.0.1:29400"], capsys)
    assert not (tmp_path / "run").exists()
