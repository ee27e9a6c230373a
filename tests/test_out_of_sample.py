"""Finetune, then backtest out of sample: `train_until` cuts a panel and the span is recorded beside the run and
its best checkpoint; the backtest keeps only origins after it, refuses overlapping ones in one line,
scores them with --allow-overlap (marked), and puts two checkpoints side by side on the same origins."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kronos_core.errors import KronosError
from kronos_core.sizes import build_model
from kronos_core.train import TrainConfig, Trainer
from kronos_core.train.data_span import read_data_span
from kronos_core.train.loading import load_training_data
from kronos_tune.cli import main
from synthetic_panel import synthetic_universe
from tiny_preset import TINY_TRAIN

ROWS = 120
LATE_START = 40  # one symbol starts later: uneven lengths
BACKTEST = ["--lookback", 32, "--pred-len", 4, "--top-k", 2, "--device", "cpu"]


def _write_panel(path: Path) -> Path:
    panel = synthetic_universe(6, n_rows=ROWS, seed=0).drop(columns=["sector"]).rename(columns={"symbol": "Symbol"})
    late = panel["Symbol"] == "SYN0005"
    panel = panel[~late | (panel.groupby("Symbol").cumcount() >= LATE_START)]
    panel.to_csv(path, index=False)
    return path


def _config(panel: Path, out: Path, **changes) -> TrainConfig:
    values = {**TINY_TRAIN, "data": [str(panel)], "symbol_column": "Symbol", "device": "cpu",
              "output_dir": str(out), **changes}
    values.pop("synthetic_series"), values.pop("synthetic_rows")
    return TrainConfig(**values)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A panel, a 2-step finetune on its first 75 % (a run folder) and a plain saved random-init checkpoint."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("oos")
    panel = _write_panel(root / "panel.csv")
    with Trainer(_config(panel, root / "run", train_until="0.75")) as trainer:
        trainer.fit(2)
    build_model("tiny", seed=7).save_pretrained(root / "plain")
    torch.set_num_threads(threads)
    return {"panel": panel, "run": root / "run", "plain": root / "plain", "root": root}


def _timeline(panel: Path) -> pd.DatetimeIndex:
    return pd.DatetimeIndex(sorted(pd.to_datetime(pd.read_csv(panel)["timestamps"]).unique()))


def test_the_span_is_recorded_in_the_run_and_beside_the_checkpoint(models):
    timeline = _timeline(models["panel"])
    cut = timeline[int(np.ceil(0.75 * len(timeline))) - 1]
    for folder in (models["run"], models["run"] / "best"):
        span = read_data_span(folder)
        assert span is not None, folder
        assert span["train_until"] == "0.75" and span["cut"] == str(cut) and span["last_bar"] == str(cut)
        assert span["first_bar"] == str(timeline[0]) and span["data_first_bar"] == str(timeline[0])
        assert span["data_last_bar"] == str(timeline[-1])
        assert span["symbol_column"] == "Symbol" and span["series"] == 6 and span["series_used"] == 6
        assert span["data"] == [{"path": str(models["panel"].resolve()), "bytes": models["panel"].stat().st_size}]
    assert read_data_span(models["run"] / "best")["step"] == 2


def test_training_reads_only_bars_up_to_the_cut(models, tmp_path: Path):
    frames, span = load_training_data(_config(models["panel"], tmp_path, train_until="0.75"))
    cut = pd.Timestamp(span.cut)
    assert len(frames) == 6 and all(frame["timestamps"].max() == cut for frame in frames)
    assert sum(len(f) for f in frames) == 5 * 90 + (90 - LATE_START)
    # A date without a time keeps that whole day; one with a time stops there.
    timeline = _timeline(models["panel"])
    day = timeline[60].normalize()
    _, whole_day = load_training_data(_config(models["panel"], tmp_path, train_until=str(day.date())))
    assert pd.Timestamp(whole_day.cut) == timeline[timeline.normalize() == day][-1]
    _, at_time = load_training_data(_config(models["panel"], tmp_path, train_until=str(timeline[60])))
    assert pd.Timestamp(at_time.cut) == timeline[60]
    # Without a cut the span is the whole data.
    _, whole = load_training_data(_config(models["panel"], tmp_path))
    assert whole.cut is None and whole.last_bar == str(timeline[-1])


def test_resuming_with_another_cut_is_refused_and_keeps_the_run(models, one_thread):
    with pytest.raises(KronosError, match="this run trained with train_until '0.75', the config now gives '0.5'"):
        Trainer(_config(models["panel"], models["run"], train_until="0.5"), resume=models["run"])
    assert read_data_span(models["run"])["train_until"] == "0.75"
    assert TrainConfig.from_toml(models["run"] / "config.toml").train_until == "0.75"


@pytest.mark.parametrize("until", ["2030-01-01", "2000-01-01", "2024-01-04 11:30:00"])
def test_a_cut_outside_the_data_is_one_line(models, tmp_path: Path, until: str):
    with pytest.raises(KronosError, match=r"is outside the data \(panel.csv: 2024-01-02 09:35:00 to "
                                          r"2024-01-04 11:30:00\)"):
        load_training_data(_config(models["panel"], tmp_path, train_until=until))


def _cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as caught:
        main([*map(str, args)])
    captured = capsys.readouterr()
    return caught.value.code or 0, captured.out, captured.err


@pytest.mark.parametrize("until, message", [
    ("2030-01-01", "train_until '2030-01-01' (--train-until) is outside the data (panel.csv: 2024-01-02 09:35:00 "
                   "to 2024-01-04 11:30:00)"),
    ("1.5", "train_until '1.5' (--train-until): a fraction must be between 0 and 1"),
    ("soon", "train_until 'soon' (--train-until) is neither a date"),
])
def test_train_until_bad_input_through_the_cli(models, tmp_path: Path, capsys, until: str, message: str):
    config = tmp_path / "tiny.toml"
    config.write_text('model_size = "tiny"\nlookback_window = 16\npredict_window = 4\nbatch_size = 8\n'
                      'samples_per_epoch = 64\nepochs = 1\neval_samples = 16\n')
    code, _, err = _cli(capsys, "train", "--config", config, "--data", models["panel"], "--symbol-column", "Symbol",
                        "--train-until", until, "--steps", 1, "--out", tmp_path / "run", "--no-tensorboard")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_backtest_of_a_run_folder_keeps_only_origins_after_its_span(models, tmp_path: Path, capsys, one_thread):
    code, out, err = _cli(capsys, "backtest", "--checkpoint", models["run"], "--data", models["panel"], *BACKTEST,
                          "--out", tmp_path / "bt", "--json")
    assert code == 0, err
    report = json.loads(out)
    span = report["training_span"]
    cut = pd.Timestamp(read_data_span(models["run"] / "best")["last_bar"])
    assert span["checked"] is True and span["out_of_sample"] is True and span["origins_in_span"] == 0
    assert pd.Timestamp(report["first_origin"]) >= cut and span["cut"] == str(cut)
    assert "out of sample: the" in err and "earlier ones left out" in err
    assert report["model"] == str(models["run"] / "best")  # the run's best/, with the run's own tokenizer


def test_overlapping_origins_are_refused_and_allow_overlap_marks_them(models, tmp_path: Path, capsys, one_thread):
    args = ["backtest", "--checkpoint", models["run"], "--data", models["panel"], *BACKTEST, "--origins", 9]
    code, _, err = _cli(capsys, *args, "--out", tmp_path / "refused")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "--origins 9: 2 of them" in err and "predict bars inside the span run/best was trained on" in err
    assert "ask for at most 7 origins, or --allow-overlap" in err
    assert not (tmp_path / "refused").exists()

    code, out, err = _cli(capsys, *args, "--allow-overlap", "--out", tmp_path / "forced")
    assert code == 0, err
    assert "IN-SAMPLE (--allow-overlap): 2 origins" in out and "2 IN-SAMPLE" in out
    report = json.loads((tmp_path / "forced" / "backtest.json").read_text())
    assert report["in_sample_origins"] == 2 and report["training_span"]["allow_overlap"] is True
    assert report["training_span"]["out_of_sample"] is False and report["origins"] == 9
    table = pd.read_csv(tmp_path / "forced" / "origins.csv")
    assert table["in_sample"].tolist() == [True] * 2 + [False] * 7


def test_compare_two_checkpoints_gives_two_rows_on_the_same_origins(models, tmp_path: Path, capsys, one_thread):
    code, out, err = _cli(capsys, "backtest", "--checkpoint", models["plain"], "--tokenizer",
                          models["run"] / "tokenizer", "--data", models["panel"], *BACKTEST, "--origins", 3,
                          "--compare", f"checkpoint={models['run']}", "--out", tmp_path / "bt")
    assert code == 0, err
    report = json.loads((tmp_path / "bt" / "backtest.json").read_text())
    rows = report["rows"]
    assert [r["model"] for r in rows] == ["plain", "run/best"]
    for r in rows:
        for key in ("ic_mean", "rank_ic_mean", "icir", "rank_icir", "hit_rate", "cumulative_return", "sharpe"):
            assert key in r
        assert r["icir"] == pytest.approx(r["ic_mean"] / r["ic_std"])
    assert report["compare"]["setting"]["checkpoint"] == str(models["run"] / "best")
    assert report["compare"]["setting"]["tokenizer"] == str(models["run"] / "tokenizer")
    assert report["compare"]["agreement"]["origins"] == 3
    a, b = (sorted((tmp_path / "bt" / "predictions" / slot).glob("origin-*.csv")) for slot in "ab")
    assert len(a) == len(b) == 3
    for x, y in zip(a, b):
        x, y = pd.read_csv(x), pd.read_csv(y)
        assert x[["origin", "timestamp", "symbol", "realized_close"]].equals(y[["origin", "timestamp", "symbol",
                                                                                "realized_close"]])
        assert not np.array_equal(x["predicted_close"], y["predicted_close"])  # two different models
    # The plain checkpoint has no span (a note), the run's span is checked: all 3 origins after it.
    assert "plain records no training span" in out and report["training_span"]["out_of_sample"] is True
    assert "ranking agreement run/best vs plain" in out and "ICIR / RankICIR" in out
    assert report["conventions"]["rank_ic"].startswith("cross-sectional Spearman")
