"""Run folders (kronos_tune.runs): a resume that does not match the folder's run is refused in one line that
names what differs, and the folder is left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from kronos_tune.errors import KronosTuneError
from kronos_tune.runs import claim_run_dir, read_run_file

IDENTITY = {"model": "tiny", "lookback": 32, "pred_len": 4, "origins": 2, "top_k": 2, "seed": 0}


def test_a_resume_with_other_settings_names_only_what_differs_and_keeps_the_run(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    claim_run_dir(folder, "backtest", IDENTITY).mark("complete", origins=2)
    before = (folder / "run.json").read_text(encoding="utf-8")
    with pytest.raises(KronosTuneError) as refused:
        claim_run_dir(folder, "backtest", {**IDENTITY, "lookback": 48, "origins": 3}, resume=True)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"--resume {folder}: that 'backtest' run was started with")
    assert "lookback: 32 there, 48 now; origins: 2 there, 3 now" in message
    assert "pred_len" not in message and "seed" not in message  # what matches is not listed
    assert (folder / "run.json").read_text(encoding="utf-8") == before
    assert read_run_file(folder)["status"] == "complete"
    # a key outside `same` may differ; another command is named as such
    assert claim_run_dir(folder, "backtest", {**IDENTITY, "seed": 9}, resume=True,
                         same=("model", "lookback")).resumed
    with pytest.raises(KronosTuneError, match="that folder holds a 'backtest' run .*, not a 'predict' run"):
        claim_run_dir(folder, "predict", IDENTITY, resume=True)


def test_a_second_node_joins_the_running_run_of_the_same_identity_and_nothing_else(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    claim_run_dir(folder, "backtest", IDENTITY, join=True).mark("running", origins=2)  # the first node
    joined = claim_run_dir(folder, "backtest", IDENTITY, join=True)
    assert joined.mode == "join" and not joined.resumed and joined.extra["origins"] == 2
    with pytest.raises(KronosTuneError, match="already holds a 'backtest' run"):
        claim_run_dir(folder, "backtest", IDENTITY)  # without --nnodes a running run is not joined
    with pytest.raises(KronosTuneError, match="already holds"):
        claim_run_dir(folder, "backtest", {**IDENTITY, "lookback": 48}, join=True)  # another run's settings
    claim_run_dir(folder, "backtest", IDENTITY, join=True).mark("complete", origins=2)
    with pytest.raises(KronosTuneError, match="already holds"):
        claim_run_dir(folder, "backtest", IDENTITY, join=True)  # a finished run is not joined


def test_run_json_names_the_cpu_of_the_session_that_wrote_it(tmp_path: Path) -> None:
    from kronos_core.cpu_features import detect_cpu_features

    run = claim_run_dir(tmp_path / "run", "predict", {"what": "x"})
    run.mark("running")
    cpu = read_run_file(run.path)["cpu"]
    assert cpu == detect_cpu_features().summary() and "cores" in cpu
