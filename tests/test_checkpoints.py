"""One resolver for what --checkpoint (predict, backtest, --compare) and predictor_dir (train) may name:
a checkpoint folder, a training run's folder (its best/ and tokenizer) or a hub id; checked before any work."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import torch

from kronos_core.model import Kronos
from kronos_core.sizes import build_model, build_tokenizer
from kronos_core.tokenizer import KronosTokenizer
from kronos_core.train import TrainConfig
from kronos_tune.checkpoints import resolve_checkpoint, resolve_pair
from kronos_tune.cli import main
from kronos_tune.commands.train import checked_weights
from kronos_tune.errors import KronosTuneError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A training run's folder as `kronos-tune train` leaves it: config.toml, best/, its random-init tokenizer."""
    run = tmp_path_factory.mktemp("runs") / "tiny-20261203-090538"
    TrainConfig(model_size="tiny", output_dir=str(run)).to_toml(run / "config.toml")
    build_model("tiny").save_pretrained(run / "best")
    build_tokenizer("tiny").save_pretrained(run / "tokenizer")
    return run


def _cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as caught:
        main([*map(str, args)])
    captured = capsys.readouterr()
    return caught.value.code or 0, captured.out, captured.err


def test_a_run_folder_means_its_best_and_its_tokenizer(run_folder: Path) -> None:
    assert resolve_pair(run_folder, None) == (run_folder / "best", run_folder / "tokenizer")
    assert resolve_pair(run_folder / "best", None) == (run_folder / "best", run_folder / "tokenizer")
    given = run_folder / "tokenizer"
    assert resolve_pair(run_folder, given) == (run_folder / "best", given)  # a given tokenizer wins


def test_a_typo_names_the_folder_and_the_close_ones(run_folder: Path) -> None:
    typo = run_folder.parent / "tiny-2026"
    with pytest.raises(KronosTuneError, match=rf"^--compare checkpoint={typo} does not exist; did you mean "
                                              rf"{run_folder}\?$"):
        resolve_checkpoint(typo, "--compare checkpoint=")


def test_a_run_without_best_and_a_stranger_folder_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "early").mkdir()
    (tmp_path / "early" / "config.toml").write_text('model_size = "tiny"\n')
    with pytest.raises(KronosTuneError, match="the training run .*early has no best/ checkpoint yet"):
        resolve_checkpoint(tmp_path / "early")
    with pytest.raises(KronosTuneError, match="has no config.json: neither a checkpoint folder"):
        resolve_checkpoint(tmp_path)


def test_hub_ids_pass_through_but_a_local_looking_typo_does_not(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_checkpoint("NeoQuasar/Kronos-small@main").checkpoint == Path("NeoQuasar/Kronos-small@main")
    (tmp_path / "runs").mkdir()
    with pytest.raises(KronosTuneError, match="runs/mini does not exist"):
        resolve_checkpoint("runs/mini")


def test_predict_takes_a_run_folder_without_tokenizer(run_folder: Path, capsys, one_thread) -> None:
    code, out, err = _cli(capsys, "predict", "--checkpoint", run_folder, "--synthetic", 1, "--lookback", 16,
                          "--pred-len", 2, "--device", "cpu", "--json")
    assert code == 0, err


def test_a_missing_compare_checkpoint_stops_the_backtest_before_any_folder(run_folder: Path, tmp_path: Path,
                                                                           capsys) -> None:
    missing = run_folder.parent / "tiny-2026"
    code, _, err = _cli(capsys, "backtest", "--checkpoint", run_folder, "--compare",
                        f"checkpoint={missing},tokenizer={run_folder / 'tokenizer'}", "--synthetic", 2,
                        "--lookback", 16, "--pred-len", 2, "--out", tmp_path / "bt")
    assert code == 2 and err.strip() == (f"error: --compare checkpoint={missing} does not exist; did you mean "
                                         f"{run_folder}?")
    assert not (tmp_path / "bt").exists()


def test_train_finetunes_from_a_run_folder(run_folder: Path) -> None:
    config = TrainConfig(model_size="tiny", predictor_dir=str(run_folder))
    assert checked_weights(config, None) == {"predictor_dir": str(run_folder / "best"),
                                             "tokenizer_dir": str(run_folder / "tokenizer")}
    with pytest.raises(KronosTuneError, match="^predictor_dir .*tiny-2026 does not exist"):
        checked_weights(config.replace(predictor_dir=str(run_folder.parent / "tiny-2026")), None)


def _section_blocks(page: Path, heading: str) -> dict[str, str]:
    """The fenced blocks (by language) of one section of a docs page."""
    section = page.read_text(encoding="utf-8").split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return {language: body for language, body in re.findall(r"^```(\w+)\n(.*?)^```", section, re.M | re.S)}


def test_the_docs_random_weights_of_a_published_size_load_back(tmp_path: Path, monkeypatch, capsys,
                                                               one_thread) -> None:
    blocks = _section_blocks(ROOT / "docs" / "checkpoints.md", "Random weights of a published size, offline")
    monkeypatch.chdir(tmp_path)
    exec(blocks["python"], {})  # the page's two calls, as a reader pastes them
    model, tokenizer = Kronos.from_pretrained("Kronos-mini-random"), KronosTokenizer.from_pretrained(
        "Kronos-Tokenizer-2k-random")
    for loaded, built in ((model, build_model("mini", seed=0)), (tokenizer, build_tokenizer("mini", seed=0))):
        expected = built.state_dict()
        assert loaded.state_dict().keys() == expected.keys()
        assert all(torch.equal(value, expected[name]) for name, value in loaded.state_dict().items())
    command = shlex.split(blocks["bash"].replace("\\\n", " "))
    assert command[:2] == ["kronos-tune", "predict"]
    code, out, err = _cli(capsys, *command[1:], "--device", "cpu", "--json")
    assert code == 0 and "Traceback" not in err, err
    assert json.loads(out)["series"] == 4
