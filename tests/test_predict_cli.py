"""`kronos-tune predict` end to end with the tiny model: files, synthetic, holdout, checkpoints, errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from kronos_core.pretrained import WEIGHTS_NAME
from kronos_core.data.kline import FEATURE_COLUMNS, read_kline
from kronos_core.predict.predictor import KronosPredictor
from kronos_core.safetensors_io import load_safetensors, save_safetensors
from kronos_core.sizes import build_model, build_tokenizer
from kronos_core.data.synthetic import synthetic_kline
from kronos_tune.cli import main

LOOKBACK, PRED_LEN = 48, 4
# a.csv (190 five-minute bars) ends Friday 14:50; b.csv (120 bars) ends Thursday 11:30.
EXPECTED_STAMPS = {
    "a": [pd.Timestamp(t) for t in ("2024-01-05 14:55", "2024-01-05 15:00", "2024-01-08 09:35", "2024-01-08 09:40")],
    "b": [pd.Timestamp(t) for t in ("2024-01-04 13:05", "2024-01-04 13:10", "2024-01-04 13:15", "2024-01-04 13:20")],
}


def _write_csvs(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "a.csv", folder / "b.csv"]
    synthetic_kline(190, seed=1).to_csv(paths[0], index=False)
    synthetic_kline(120, seed=2).to_csv(paths[1], index=False)
    return paths


def _run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as caught:
        main(["predict", "--device", "cpu", *map(str, args)])
    captured = capsys.readouterr()
    return caught.value.code, captured.out, captured.err


def _run_json(capsys: pytest.CaptureFixture[str], *args: object) -> dict:
    code, out, err = _run(capsys, *args, "--json")
    assert code == 0, err
    assert "Traceback" not in err
    return json.loads(out)


def _console_script() -> str:
    search_path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    script = shutil.which("kronos-tune", path=search_path)
    assert script is not None, "the kronos-tune console script is not installed"
    return script


def test_csv_files_to_csv_continue_the_session_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _write_csvs(tmp_path / "data")
    out = tmp_path / "pred.csv"
    report = _run_json(capsys, "--size", "tiny", "--data", a, "--data", b, "--lookback", LOOKBACK,
                       "--pred-len", PRED_LEN, "--out", out)
    assert report["series"] == 2 and report["out"] == str(out) and report["device"] == "cpu"
    assert report["random_weights"] is True and report["series_per_s"] > 0 and report["peak_rss_bytes"] > 0
    assert "mae" not in report
    written = pd.read_csv(out, parse_dates=["timestamps"])
    assert list(written.columns) == ["series", "timestamps", *FEATURE_COLUMNS]
    assert len(written) == 2 * PRED_LEN
    for name, stamps in EXPECTED_STAMPS.items():
        part = written[written["series"] == name]
        assert list(part["timestamps"]) == stamps
        assert np.isfinite(part[list(FEATURE_COLUMNS)].to_numpy()).all()


def test_folder_to_parquet_matches_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "data"
    _write_csvs(folder)
    common = ("--size", "tiny", "--data", folder, "--lookback", LOOKBACK, "--pred-len", PRED_LEN, "--top-k", 1)
    _run_json(capsys, *common, "--out", tmp_path / "p.parquet")
    _run_json(capsys, *common, "--out", tmp_path / "p.csv")
    parquet = pd.read_parquet(tmp_path / "p.parquet")
    csv = pd.read_csv(tmp_path / "p.csv", parse_dates=["timestamps"])
    assert list(parquet.columns) == ["series", "timestamps", *FEATURE_COLUMNS]
    assert list(parquet["series"]) == ["a"] * PRED_LEN + ["b"] * PRED_LEN
    assert list(parquet["timestamps"]) == EXPECTED_STAMPS["a"] + EXPECTED_STAMPS["b"]
    # The CSV is rounded like the input: prices to its 6 decimals, share counts to whole numbers.
    np.testing.assert_allclose(parquet[["open", "high", "low", "close"]], csv[["open", "high", "low", "close"]],
                               rtol=0, atol=5e-7)
    np.testing.assert_allclose(parquet["volume"], csv["volume"], rtol=0, atol=0.5)
    assert (csv["volume"] == csv["volume"].round()).all()


def test_synthetic_series_without_out_prints_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--size", "tiny", "--synthetic", 3, "--lookback", 32, "--pred-len", 3)
    assert code == 0, err
    assert "random weights: predictions are meaningless, for timing only" in out
    assert "predictions: synthetic_0" in out and "synthetic_1" not in out
    assert "not saved: pass --out FILE.csv or FILE.parquet to write all 9 rows of 3 series" in out
    assert "3 series in" in out and "series/s" in out and "peak RSS" in out

    report = _run_json(capsys, "--size", "tiny", "--synthetic", 3, "--lookback", 32, "--pred-len", 3,
                       "--out", tmp_path / "s.csv")
    assert report["series"] == 3
    written = pd.read_csv(tmp_path / "s.csv")
    assert list(written["series"].unique()) == ["synthetic_0", "synthetic_1", "synthetic_2"]
    assert len(written) == 9


def test_holdout_reports_mae_and_mape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _write_csvs(tmp_path / "data")
    out = tmp_path / "h.csv"
    report = _run_json(capsys, "--size", "tiny", "--data", a, "--data", b, "--lookback", LOOKBACK,
                       "--pred-len", PRED_LEN, "--holdout", "--out", out)
    per_series = {item["series"]: item for item in report["per_series"]}
    assert set(per_series) == {"a", "b"}
    written = pd.read_csv(out, parse_dates=["timestamps"])
    for name, path in (("a", a), ("b", b)):
        actual = read_kline(path).iloc[-PRED_LEN:]
        predicted = written[written["series"] == name]
        assert list(predicted["timestamps"]) == list(actual["timestamps"])  # the held-out rows' own stamps
        error = np.abs(predicted["close"].to_numpy() - actual["close"].to_numpy())
        # scores use the predictions before the CSV rounds them to the input's 6 decimals
        assert per_series[name]["mae"] == pytest.approx(error.mean(), rel=0, abs=5e-7)
        assert per_series[name]["mape"] == pytest.approx((error / actual["close"].to_numpy()).mean() * 100,
                                                         rel=0, abs=1e-5)
    assert report["mae"] == pytest.approx((per_series["a"]["mae"] + per_series["b"]["mae"]) / 2)
    assert report["mape"] == pytest.approx((per_series["a"]["mape"] + per_series["b"]["mape"]) / 2)


def test_checkpoint_round_trip_equals_direct_predict_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, tokenizer = build_model("tiny", seed=3), build_tokenizer("tiny", seed=4)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    paths = _write_csvs(tmp_path / "data")
    out = tmp_path / "pred.parquet"
    report = _run_json(capsys, "--checkpoint", tmp_path / "model", "--tokenizer", tmp_path / "tokenizer",
                       "--data", paths[0], "--data", paths[1], "--lookback", LOOKBACK, "--pred-len", PRED_LEN,
                       "--top-k", 1, "--seed", 11, "--out", out)
    assert report["random_weights"] is False and not any("random weights" in n for n in report["notes"])

    histories = [read_kline(path).iloc[-LOOKBACK:] for path in paths]
    predictor = KronosPredictor(model, tokenizer, device="cpu", max_context=512)
    torch.manual_seed(11)
    expected = predictor.predict_batch([h[list(FEATURE_COLUMNS)] for h in histories],
                                       [h["timestamps"] for h in histories],
                                       [pd.DatetimeIndex(EXPECTED_STAMPS[n]) for n in ("a", "b")],
                                       PRED_LEN, top_k=1, verbose=False)
    written = pd.read_parquet(out)
    for name, frame in zip(("a", "b"), expected):
        part = written[written["series"] == name]
        assert list(part["timestamps"]) == list(frame.index)
        np.testing.assert_array_equal(part[list(FEATURE_COLUMNS)].to_numpy(), frame.to_numpy())


# Errors: one line on stderr, exit 2, no traceback --------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    build_model("tiny").save_pretrained(root / "good")
    build_tokenizer("tiny").save_pretrained(root / "tokenizer")
    shutil.copytree(root / "good", root / "no_config")
    (root / "no_config" / "config.json").unlink()
    shutil.copytree(root / "good", root / "truncated")
    weights = root / "truncated" / WEIGHTS_NAME
    with open(weights, "r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)
    shutil.copytree(root / "good", root / "renamed")
    state = load_safetensors(root / "renamed" / WEIGHTS_NAME)
    state["head.renamed_weight"] = state.pop("head.proj_s1.weight")
    save_safetensors(state, root / "renamed" / WEIGHTS_NAME)
    return {"root": root, "tokenizer": root / "tokenizer"}


def _bad_data(folder: Path) -> dict[str, Path]:
    folder.mkdir(exist_ok=True)
    frame = synthetic_kline(60, seed=0)
    frame.drop(columns=["low"]).to_csv(folder / "no_low.csv", index=False)
    frame.iloc[:20].to_csv(folder / "short.csv", index=False)
    frame.to_csv(folder / "ok.csv", index=False)
    return {name: folder / f"{name}.csv" for name in ("no_low", "short", "ok")}


ERROR_CASES = {
    "missing config.json": (["--checkpoint", "{root}/no_config", "--tokenizer", "{tokenizer}", "--data", "{ok}"],
                            "no_config has no config.json"),
    "truncated weights": (["--checkpoint", "{root}/truncated", "--tokenizer", "{tokenizer}", "--data", "{ok}"],
                          "model.safetensors is truncated"),
    "renamed key": (["--checkpoint", "{root}/renamed", "--tokenizer", "{tokenizer}", "--data", "{ok}"],
                    "lacks weight 'head.proj_s1.weight'"),
    "checkpoint without tokenizer": (["--checkpoint", "{root}/good", "--data", "{ok}"], "needs --tokenizer"),
    "missing price column": (["--size", "tiny", "--data", "{no_low}"], "no_low.csv: missing price column 'low'"),
    "shorter than lookback": (["--size", "tiny", "--data", "{short}"],
                              "short.csv has 20 rows, fewer than --lookback 40"),
    # The --out check comes before any work: the missing data file is never reached.
    "bad out suffix": (["--size", "tiny", "--data", "{root}/missing.csv", "--out", "{root}/o.txt"],
                       "unknown suffix '.txt'"),
    "out folder is a file": (["--size", "tiny", "--data", "{ok}", "--out", "{ok}/o.csv"], "is not a folder"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_user_errors_are_one_line(case: str, checkpoints: dict[str, Path], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    args, fragment = ERROR_CASES[case]
    values = {"root": checkpoints["root"], "tokenizer": checkpoints["tokenizer"], **_bad_data(tmp_path)}
    code, out, err = _run(capsys, *(arg.format(**values) for arg in args), "--lookback", 40, "--pred-len", 2)
    assert code == 2
    assert err.startswith("error: ") and fragment in err, err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err + out


def test_a_file_too_short_is_left_out_as_a_panel_symbol_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _bad_data(tmp_path / "bad")
    folder = tmp_path / "two"
    folder.mkdir()
    for name in ("short", "ok"):
        shutil.copy(data[name], folder / f"{name}.csv")
    report = _run_json(capsys, "--size", "tiny", "--data", folder, "--lookback", 40, "--pred-len", 2)
    assert report["series"] == 1
    assert any("skipped 1 files with too few rows (20 rows, fewer than lookback 40 for short): short" in note
               for note in report["notes"])
    code, _, err = _run(capsys, "--size", "tiny", "--data", folder, "--lookback", 80, "--pred-len", 2)
    assert code == 2 and "every --data file has fewer rows than --lookback 80 (the longest has 60)" in err


def test_console_script_error_and_success(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    data = _bad_data(tmp_path)
    done = subprocess.run([_console_script(), "predict", "--checkpoint", str(checkpoints["root"] / "truncated"),
                           "--tokenizer", str(checkpoints["tokenizer"]), "--data", str(data["ok"]),
                           "--lookback", "40", "--pred-len", "2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "is truncated" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr + done.stdout

    out = tmp_path / "ok.parquet"
    done = subprocess.run([_console_script(), "predict", "--checkpoint", str(checkpoints["root"] / "good"),
                           "--tokenizer", str(checkpoints["tokenizer"]), "--synthetic", "2", "--device", "cpu",
                           "--lookback", "40", "--pred-len", "2", "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["series"] == 2 and report["out"] == str(out)
    assert len(pd.read_parquet(out)) == 4


# Output a user can read, panels, sharding checks ----------------------------------------------


def test_csv_without_volume_is_noted_rounded_and_never_negative(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    frame = synthetic_kline(80, seed=5)
    frame[["open", "high", "low", "close"]] = frame[["open", "high", "low", "close"]].round(2)
    frame.drop(columns=["volume", "amount"]).to_csv(tmp_path / "novol.csv", index=False)
    frame.assign(volume=frame["volume"].round(0)).to_csv(tmp_path / "full.csv", index=False)
    out = tmp_path / "p.csv"
    report = _run_json(capsys, "--size", "tiny", "--data", tmp_path / "novol.csv", "--data", tmp_path / "full.csv",
                       "--lookback", 40, "--pred-len", 3, "--out", out)
    assert any("1 of 2 series have no volume/amount column" in n for n in report["notes"])
    assert any("rounds prices to 2 decimals" in n for n in report["notes"])
    text = out.read_text().splitlines()
    written = pd.read_csv(out)
    novol = written[written["series"] == "novol"]
    assert (novol[["volume", "amount"]] == 0).all().all()
    assert (written[["volume", "amount"]] >= 0).all().all()
    for line in text[1:]:  # prices carry at most 2 decimals, volume is a whole number
        fields = line.split(",")
        assert all(len(value.partition(".")[2]) <= 2 for value in fields[2:6]), line
        assert "." not in fields[6] and "e" not in fields[6].lower(), line
    predictions = {item["series"]: item for item in report["predictions"]}
    assert set(predictions) == {"novol", "full"} and len(predictions["full"]["close"]) == 3
    full = written[written["series"] == "full"]  # a --out job writes its series in name order
    assert list(written["series"]) == ["full"] * 3 + ["novol"] * 3
    assert predictions["full"]["timestamps"][0] == full["timestamps"].iloc[0].replace(" ", "T")
    np.testing.assert_allclose(predictions["full"]["close"], full["close"].to_numpy())


def _write_panel(path: Path, symbols: dict[str, int]) -> pd.DataFrame:
    parts = [synthetic_kline(rows, seed=k).assign(ticker=name) for k, (name, rows) in enumerate(symbols.items())]
    panel = pd.concat(parts, ignore_index=True)
    panel.to_csv(path, index=False)
    return panel


def test_panel_file_predicts_every_symbol_like_separate_files(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    panel = _write_panel(tmp_path / "panel.csv", {"AAA": 190, "BBB": 120})
    for name in ("AAA", "BBB"):
        panel[panel["ticker"] == name].drop(columns=["ticker"]).to_csv(tmp_path / f"{name}.csv", index=False)
    common = ("--size", "tiny", "--lookback", LOOKBACK, "--pred-len", PRED_LEN, "--top-k", 1, "--max-batch-size", 2)
    _run_json(capsys, *common, "--data", tmp_path / "panel.csv", "--symbol-column", "Ticker",
              "--out", tmp_path / "from_panel.parquet")
    _run_json(capsys, *common, "--data", tmp_path / "AAA.csv", "--data", tmp_path / "BBB.csv",
              "--out", tmp_path / "from_files.parquet")
    from_panel = pd.read_parquet(tmp_path / "from_panel.parquet")
    from_files = pd.read_parquet(tmp_path / "from_files.parquet")
    # the panel's symbol column keeps its name (as the file spells it); per-series files are named by "series"
    assert list(from_panel.columns[:2]) == ["ticker", "timestamps"]
    assert list(from_panel["ticker"]) == list(from_files["series"]) == ["AAA"] * PRED_LEN + ["BBB"] * PRED_LEN
    assert list(from_panel["timestamps"]) == EXPECTED_STAMPS["a"] + EXPECTED_STAMPS["b"]
    np.testing.assert_array_equal(from_panel[list(FEATURE_COLUMNS)].to_numpy(),
                                  from_files[list(FEATURE_COLUMNS)].to_numpy())


def test_panel_and_sharding_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_panel(tmp_path / "panel.csv", {"AAA": 60, "SHORT": 10})
    common = ("--size", "tiny", "--lookback", 40, "--pred-len", 2, "--data", tmp_path / "panel.csv")
    cases = [
        (("--symbol-column", "code"), "no symbol column 'code' (found: timestamps, open, high, low, close, volume, "
                                      "amount, ticker)"),
        (("--symbol-column", "ticker", "--lookback", 100), "no symbol has 100 rows (the longest has 60); use a "
                                                           "shorter --lookback"),
        (("--symbol-column", "ticker", "--resume", "--out", tmp_path / "p.csv"),
         "--resume: no work folder"),
        (("--symbol-column", "ticker", "--out", tmp_path / "absent" / "p.csv"), "absent does not exist"),
    ]
    for extra, fragment in cases:
        code, out, err = _run(capsys, *common, *extra)
        assert code == 2 and err.startswith("error: ") and fragment in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err + out
    report = _run_json(capsys, *common, "--symbol-column", "ticker")  # too short: left out, one line
    assert report["series"] == 1 and any("skipped 1 symbols" in n and "SHORT" in n for n in report["notes"])
    mixed = synthetic_kline(60, seed=3).assign(ticker="MIX")
    mixed.loc[30, "timestamps"] = mixed.loc[29, "timestamps"] + pd.Timedelta(minutes=1)
    mixed.to_csv(tmp_path / "mixed.csv", index=False)
    code, _, err = _run(capsys, "--size", "tiny", "--lookback", 40, "--pred-len", 2, "--data", tmp_path / "mixed.csv",
                        "--symbol-column", "ticker")
    assert code == 2 and "symbol MIX mixes bar intervals" in err and len(err.strip().splitlines()) == 1
