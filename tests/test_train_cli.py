"""`kronos-tune train`: real runs of the command on the tiny model (in process and as a subprocess)."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import pytest
from rich.console import Console

from kronos_core.model import Kronos
from kronos_core.tokenizer import KronosTokenizer
from kronos_core.train import TrainConfig, load_checkpoint
from kronos_tune.cli import main
from kronos_tune.commands.train import ConsoleListener
from kronos_tune.train.job import train_here
from machine import interrupt_when
from tiny_preset import tiny_train_toml

pytestmark = pytest.mark.usefixtures("one_thread")


def run_in_process(config: TrainConfig, steps: int, resume: Path | None, console: Console, meter=None) -> int:
    """One stage trained in this process and drawn on `console` as the command draws it; its exit code."""
    listener = ConsoleListener(console)
    try:
        return train_here(config, steps, resume, listener, meter=meter).exit_code
    finally:
        listener.close()


def write_config(tmp_path: Path, extra: str = "", epochs: int = 1) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(tiny_train_toml(epochs=epochs) + extra)
    return path


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(args)
    return info.value.code or 0


def test_train_both_writes_checkpoints_and_loadable_best(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    code = run_cli(["train", "--config", str(write_config(tmp_path)), "--what", "both", "--steps", "3",
                    "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "tokenizer training" in printed and "predictor training" in printed and "3 / 8" in printed
    assert load_checkpoint(out / "tokenizer")["step"] == 3 and load_checkpoint(out / "predictor")["step"] == 3
    assert isinstance(KronosTokenizer.from_pretrained(out / "tokenizer" / "best"), KronosTokenizer)
    assert isinstance(Kronos.from_pretrained(out / "predictor" / "best"), Kronos)
    predictor_config = TrainConfig.from_toml(out / "predictor" / "config.toml")
    assert predictor_config.tokenizer_dir == str(out / "tokenizer" / "best")


def test_user_errors_are_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    bad = write_config(tmp_path, "bach_size = 4\n")
    assert run_cli(["train", "--config", str(bad), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'batch_size'" in err
    assert run_cli(["train", "--out", str(tmp_path / "x")]) == 2
    assert "--preset NAME" in capsys.readouterr().err
    assert run_cli(["train", "--config", str(write_config(tmp_path)), "--what", "everything"]) == 2
    assert not (tmp_path / "x").exists()


def test_preset_sets_the_workload(tmp_path: Path) -> None:
    out = tmp_path / "cpu"
    assert run_cli(["train", "--preset", "cpu", "--steps", "1", "--out", str(out), "--device", "cpu"]) == 0
    written = tomllib.loads((out / "config.toml").read_text())
    assert written["model_size"] == "mini" and written["batch_size"] == 16 and written["samples_per_epoch"] == 4096
    assert load_checkpoint(out)["step"] == 1


def test_out_of_memory_is_one_message_and_keeps_the_checkpoint(tmp_path: Path) -> None:
    from kronos_tune.memory.meters import CpuExactMeter

    config = TrainConfig.from_toml(write_config(tmp_path)).replace(output_dir=str(tmp_path / "run"))
    console = Console(record=True, width=400)
    assert run_in_process(config, 2, None, console) == 0
    saved = (tmp_path / "run" / "checkpoints" / "last.pt").read_bytes()
    small_device = CpuExactMeter(budget_bytes=64 * 1024)  # a simulated 64 KiB device: real OutOfMemoryError
    assert run_in_process(config, 4, tmp_path / "run", console, meter=small_device) == 1
    text = console.export_text()
    assert "out of memory in training step 3" in text and "kronos-tune autobatch" in text and "peak seen" in text
    assert (tmp_path / "run" / "checkpoints" / "last.pt").read_bytes() == saved


@pytest.mark.slow
def test_ctrl_c_saves_a_resumable_checkpoint_and_exits_130(tmp_path: Path) -> None:
    config = write_config(tmp_path, epochs=500)  # far more steps than the test will wait for
    out = tmp_path / "run"
    # config.toml is written right before training starts
    code, stdout, stderr = interrupt_when(["train", "--config", str(config), "--out", str(out)],
                                          ready=(out / "config.toml").exists)
    assert code == 130, stdout + stderr
    assert "resume with: kronos-tune train --resume" in stdout
    state = load_checkpoint(out)
    assert 1 <= state["step"] < state["config"]["epochs"] * 8
    resumed = state["step"] + 1
    assert run_cli(["train", "--resume", str(out), "--steps", str(resumed)]) == 0
    assert load_checkpoint(out)["step"] == resumed


def test_train_says_each_warning_once_and_how_far_the_model_moved(tmp_path: Path, capsys) -> None:
    import pandas as pd

    from kronos_core.data.synthetic import synthetic_series

    frames = [frame.assign(Symbol=f"S{k}") for k, frame in enumerate(synthetic_series(2, n_rows=200, seed=0))]
    panel = pd.concat(frames, ignore_index=True)
    panel.loc[5, "high"] = panel.loc[5, ["open", "close"]].max() - 0.5  # one row a quality note names
    data = tmp_path / "panel.csv"
    panel.to_csv(data, index=False)
    out = tmp_path / "run"
    code = run_cli(["train", "--config", str(write_config(tmp_path)), "--data", str(data), "--symbol-column",
                    "Symbol", "--train-until", "0.9", "--steps", "2", "--out", str(out), "--no-tensorboard"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.err.count("rows have high below") == 1
    assert "tok/s (step)" in captured.out and "median" in captured.out and "over the whole" in captured.out
    moved = next(line for line in captured.out.splitlines() if "from its start" in line)
    assert "at step 0" in moved and "at step 2" in moved and "evaluation" in moved
    assert (out / "start_eval.json").is_file()


def test_series_too_short_for_a_window_on_each_side_of_the_split_are_refused_before_any_folder(
        tmp_path: Path, capsys) -> None:
    import pandas as pd

    from kronos_core.data.synthetic import synthetic_series

    # tiny's window is 21 rows; cut at 0.8, each series keeps 40: one window, not one on each side of the split
    frames = [frame.assign(Symbol=f"S{k}") for k, frame in enumerate(synthetic_series(2, n_rows=50, seed=0))]
    data = tmp_path / "panel.csv"
    pd.concat(frames, ignore_index=True).to_csv(data, index=False)
    out = tmp_path / "run"
    code = run_cli(["train", "--config", str(write_config(tmp_path)), "--data", str(data), "--symbol-column",
                    "Symbol", "--train-until", "0.8", "--steps", "2", "--out", str(out), "--no-tensorboard"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "holds no window of 21 rows" in err and "only from 42 rows" in err and "a later --train-until" in err
    assert not out.exists()


def test_a_change_inside_the_evaluation_noise_is_called_so() -> None:
    from kronos_tune.train.moved import Movement

    still = Movement(0, 2.5, 100, 2.499, low=-0.004, high=0.002, batches=40)
    assert "barely moved" in still.line() and "-0.0010" in still.line()
    assert "beyond the evaluation's noise" in Movement(0, 2.5, 100, 2.3, -0.25, -0.15, 40).verdict()
    assert "noise unknown" in Movement(0, 2.5, 100, 2.3, None, None, 1).line()


@pytest.mark.parametrize("flags, emulated", [(["avx2", "fma"], True), (["avx2", "avx512f", "amx_bf16"], False)])
def test_amp_bf16_in_a_config_on_a_cpu_without_native_bf16_is_one_note_and_the_run_goes_on(
        tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, flags: list[str], emulated: bool) -> None:
    import kronos_tune.workloads as workloads
    from kronos_core.cpu_features import NO_NATIVE_BF16, features_from_flags

    monkeypatch.setattr(workloads, "detect_cpu_features", lambda: features_from_flags(flags, cores=2))
    config = write_config(tmp_path, extra='amp = "bf16"\n')
    assert run_cli(["train", "--config", str(config), "--what", "predictor", "--steps", "1", "--device", "cpu",
                    "--out", str(tmp_path / "out"), "--no-tensorboard"]) == 0
    printed = capsys.readouterr().out
    notes = [line for line in printed.splitlines() if NO_NATIVE_BF16 in line]
    assert len(notes) == (1 if emulated else 0)
    if emulated:
        assert notes[0].startswith('note: amp = "bf16": ') and notes[0].endswith("the run goes on")
    assert load_checkpoint(tmp_path / "out")["step"] == 1
