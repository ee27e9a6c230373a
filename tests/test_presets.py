"""Presets: the shipped files, validation of user files, preset folders, and `kronos-tune presets`."""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable

import pytest
import tomli_w
from typer.testing import CliRunner

from kronos_tune.errors import KronosTuneError
from kronos_tune.presets import (
    BYTES_PER_GIB,
    PRESET_DIR_ENV,
    builtin_preset_dir,
    list_presets,
    load_preset_file,
    preset_dirs,
    preset_to_toml,
    resolve_preset,
)

BUILTIN_NAMES = {"rtx3080", "rtx4090", "a6000", "a100-80g", "4xa100-80g", "4x3080", "h200", "cpu"}

VALID: dict[str, Any] = {
    "name": "mybox",
    "description": "A test machine.",
    "hardware": {
        "device": "cuda",
        "device_count": 1,
        "memory_per_device_gb": 16,
        "bf16_supported": True,
        "cuda_context_overhead_gb": 0.5,
        "peak_tflops_source": "made up for the test",
        "peak_tflops": {"fp32": 10.0, "tf32": 20.0, "bf16": 40.0, "fp16": 40.0},
    },
    "workload": {
        "model_size": "small",
        "tokenizer": "base",
        "lookback_window": 90,
        "predict_window": 10,
        "batch_size": 8,
        "accumulation_steps": 2,
        "epochs": 1,
        "samples_per_epoch": 64,
        "eval_samples": 16,
    },
    "predict": {"series_count": 3, "lookback": 100, "pred_len": 5, "sample_count": 1},
}


@pytest.fixture(autouse=True)
def _no_user_preset_dirs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PRESET_DIR_ENV, raising=False)


def write_doc(folder: Path, doc: dict[str, Any], file_name: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (file_name or f"{doc['name']}.toml")
    path.write_text(tomli_w.dumps(doc), encoding="utf-8")
    return path


def edited(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    doc = copy.deepcopy(VALID)
    change(doc)
    return doc


# --- shipped presets -------------------------------------------------------------------------


REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_a_wheel_install_finds_the_builtin_presets(tmp_path: Path) -> None:
    """A non-editable install has no checkout next to the package: the wheel must carry the presets."""
    source = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for folder in ("kronos_core", "kronos_tune", "presets", "benchmarks"):  # benchmarks/: in the source, not in the wheel
        shutil.copytree(REPO / folder, source / folder, ignore=skip)

    # without PYTHONPATH: a checkout on it (a worktree's) would import instead of the installed wheel
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*command: str | Path) -> str:
        done = subprocess.run([str(c) for c in command], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", source, "-w", tmp_path / "dist")
    run(sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", tmp_path / "venv")
    python = tmp_path / "venv" / "bin" / "python"
    # --system-site-packages reaches the base interpreter's packages only; when this test itself runs in a
    # virtual environment, its dependencies (psutil, torch, ...) live there: list those folders too (after the
    # new venv's own, so the installed wheel is what imports)
    child_site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    Path(child_site, "parent-env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    wheel = next((tmp_path / "dist").glob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert {"kronos_core", "kronos_tune"} <= tops and "benchmarks" not in tops, tops
    run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel)
    probe = ("import kronos_tune, kronos_tune.presets as p; print(kronos_tune.__file__); "
             "print(p.builtin_preset_dir()); print(' '.join(sorted(x.name for x in p.list_presets())))")
    package_file, folder, names = run(python, "-c", probe).splitlines()
    venv = str(tmp_path / "venv")
    assert package_file.startswith(venv) and folder.startswith(venv), (package_file, folder)
    assert names.split() == sorted(BUILTIN_NAMES)


def test_every_shipped_preset_loads_and_round_trips(tmp_path: Path) -> None:
    files = sorted(builtin_preset_dir().glob("*.toml"))
    assert {f.stem for f in files} == BUILTIN_NAMES
    for file in files:
        preset = load_preset_file(file)
        assert preset.name == file.stem
        assert preset.source_path == file
        hw = preset.hardware
        if hw.device == "cuda":
            assert hw.peak_tflops_source, file
            assert all(hw.peak_tflops(dtype) for dtype in ("fp32", "tf32", "bf16", "fp16")), file
            assert hw.peak_tflops("bf16") >= hw.peak_tflops("fp32")  # tensor cores beat plain FP32
            assert preset.workload.model_size in ("small", "base")
            assert (preset.workload.lookback_window, preset.workload.predict_window) == (90, 10)
        copy_path = tmp_path / file.name
        copy_path.write_text(preset_to_toml(preset), encoding="utf-8")
        reloaded = load_preset_file(copy_path)
        assert reloaded == dataclasses.replace(preset, source_path=copy_path)


def test_shipped_figures() -> None:
    rtx3080 = resolve_preset("rtx3080")
    assert rtx3080.budget_bytes == 12 * BYTES_PER_GIB - BYTES_PER_GIB // 2
    assert rtx3080.peak_flops("bf16") == pytest.approx(61.3e12)
    assert resolve_preset("h200").peak_flops("bf16") == pytest.approx(989.5e12)
    big = resolve_preset("4xa100-80g")
    assert big.hardware.device_count == 4 and big.predict.series_count >= 1000
    assert big.global_batch_size == 4 * 50
    assert resolve_preset("4x3080").hardware.device_count == 4
    cpu = resolve_preset("cpu")
    assert cpu.peak_flops("bf16") is None and cpu.hardware.cuda_context_overhead_gb == 0
    assert cpu.benchmark.resolution_budget_s > cpu.benchmark.trial_budget_s  # the A/A comparison gets more rounds
    assert cpu.workload.model_size == "mini" and cpu.workload.tokenizer == "2k"
    assert cpu.budget_bytes == 8 * BYTES_PER_GIB
    with pytest.raises(KronosTuneError, match="unknown dtype 'fp8'"):
        cpu.peak_flops("fp8")


# --- validation ------------------------------------------------------------------------------


def _set(table: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        (doc[table] if table else doc)[key] = value

    return change


def _drop(table: str, key: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        del (doc[table] if table else doc)[key]

    return change


def _peak(dtype: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        doc["hardware"]["peak_tflops"][dtype] = value

    return change


BAD_DOCS = [
    # unknown keys, with and without a close match
    (_set("workload", "batch_sise", 8), "unknown key 'workload.batch_sise' (did you mean 'workload.batch_size'?); rename or remove it"),
    (_set("", "desciption", "x"), "unknown key 'desciption' (did you mean 'description'?)"),
    (_set("hardware", "memory_per_device_gib", 8), "did you mean 'hardware.memory_per_device_gb'?"),
    (_peak("fp8", 1.0), "unknown key 'hardware.peak_tflops.fp8'; rename or remove it (valid keys under [hardware.peak_tflops]: fp32,"),
    # missing keys and tables
    (_drop("workload", "epochs"), "workload.epochs is missing; add `epochs = 1` under [workload]"),
    (_drop("", "predict"), "[predict] table is missing"),
    (_drop("hardware", "peak_tflops_source"), "hardware.peak_tflops_source is missing"),
    # wrong types
    (
        _set("hardware", "memory_per_device_gb", "16"),
        "hardware.memory_per_device_gb must be a number (got string '16')",
    ),
    (_set("workload", "batch_size", 8.5), "workload.batch_size must be an integer (got float 8.5)"),
    (_set("workload", "batch_size", True), "workload.batch_size must be an integer (got boolean True)"),
    (_set("hardware", "bf16_supported", "yes"), "hardware.bf16_supported must be true, false or \"auto\""),
    (_set("hardware", "device", 1), "hardware.device must be a string"),
    (_set("", "hardware", "fast"), "hardware must be a table"),
    # impossible values
    (_set("hardware", "device_count", 0), "hardware.device_count must be >= 1 (got 0)"),
    (_set("hardware", "memory_per_device_gb", 0), "hardware.memory_per_device_gb must be > 0"),
    (_set("hardware", "memory_per_device_gb", -4.0), "hardware.memory_per_device_gb must be > 0"),
    (_set("hardware", "cuda_context_overhead_gb", 16), "hardware.cuda_context_overhead_gb (16.0) must be below"),
    (_set("hardware", "device", "tpu"), "hardware.device must be one of cuda, cpu (got 'tpu')"),
    (_peak("bf16", 0), "hardware.peak_tflops.bf16 must be > 0"),
    (_set("workload", "batch_size", 0), "workload.batch_size must be >= 1 (got 0)"),
    (_set("workload", "accumulation_steps", 0), "workload.accumulation_steps must be >= 1 (got 0)"),
    (_set("workload", "lookback_window", 0), "workload.lookback_window must be >= 1 (got 0)"),
    (_set("workload", "predict_window", -3), "workload.predict_window must be >= 1 (got -3)"),
    (_set("workload", "eval_samples", -1), "workload.eval_samples must be >= 0 (got -1)"),
    (_set("workload", "model_size", "huge"), "workload.model_size must be one of tiny, mini, small, base, large"),
    (
        _set("workload", "tokenizer", "2k"),
        "workload.tokenizer '2k' does not fit model_size 'small'; set tokenizer = \"base\"",
    ),
    (_set("workload", "amp", "fp8"), "workload.amp must be one of none, bf16, fp16"),
    (_set("workload", "samples_per_epoch", 15), "workload.samples_per_epoch (15) is less than one optimizer step"),
    (_set("predict", "pred_len", 0), "predict.pred_len must be >= 1 (got 0)"),
    (_set("predict", "sample_count", 0), "predict.sample_count must be >= 1 (got 0)"),
    (_set("predict", "lookback", 513), "predict.lookback (513) exceeds the 512-token model context"),
    (_set("", "name", "my box"), "name 'my box' is not a usable preset name"),
    (lambda doc: doc.update(benchmark={"resolution_budget_s": 0}), "benchmark.resolution_budget_s must be > 0"),
]


@pytest.mark.parametrize(("change", "expected"), BAD_DOCS, ids=[expected[:40] for _, expected in BAD_DOCS])
def test_validation_errors_name_file_and_key(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], expected: str
) -> None:
    path = write_doc(tmp_path, edited(change), "broken.toml")
    with pytest.raises(KronosTuneError) as caught:
        load_preset_file(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert expected in message
    assert "\n" not in message


def test_the_valid_document_itself_loads(tmp_path: Path) -> None:
    preset = load_preset_file(write_doc(tmp_path, VALID))
    assert preset.name == "mybox" and preset.workload.amp == "none"  # amp defaults to "none"
    assert preset.hardware.memory_per_device_gb == 16.0 and preset.budget_bytes == int(15.5 * BYTES_PER_GIB)
    assert preset.peak_flops("tf32") == pytest.approx(20e12)


def test_bf16_amp_needs_bf16_support(tmp_path: Path) -> None:
    def change(doc: dict[str, Any]) -> None:
        doc["hardware"]["bf16_supported"] = False
        doc["workload"]["amp"] = "bf16"

    with pytest.raises(KronosTuneError, match=r"workload\.amp is 'bf16' but hardware\.bf16_supported is false"):
        load_preset_file(write_doc(tmp_path, edited(change)))
    load_preset_file(write_doc(tmp_path, edited(_set("workload", "amp", "fp16"))))


@pytest.mark.parametrize(
    ("size", "tokenizer", "lookback", "predict", "fits"),
    [
        ("small", "base", 500, 11, True),  # 500 + 11 + 1 = 512 tokens: exactly the context
        ("small", "base", 500, 12, False),
        ("base", "base", 90, 500, False),
        ("mini", "2k", 2000, 47, True),  # mini has a 2048-token context
        ("mini", "2k", 2000, 48, False),
    ],
)
def test_training_window_must_fit_the_context(
    tmp_path: Path, size: str, tokenizer: str, lookback: int, predict: int, fits: bool
) -> None:
    shape = dict(model_size=size, tokenizer=tokenizer, lookback_window=lookback, predict_window=predict)
    doc = edited(lambda d: d["workload"].update(shape))
    path = write_doc(tmp_path, doc)
    if fits:
        assert load_preset_file(path).workload.window_tokens == lookback + predict + 1
        return
    with pytest.raises(KronosTuneError) as caught:
        load_preset_file(path)
    context = 2048 if size == "mini" else 512
    assert str(caught.value).startswith(f"{path}: workload.lookback_window")
    assert f"= {lookback + predict + 1} exceeds the {context}-token context of model_size '{size}'" in str(caught.value)


def test_malformed_toml_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('name = "bad"\ndescription = "x"\n[hardware\ndevice = "cuda"\n', encoding="utf-8")
    with pytest.raises(KronosTuneError) as caught:
        load_preset_file(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: malformed TOML")
    assert "line 3" in message and "\n" not in message


def test_missing_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(KronosTuneError, match="preset file not found"):
        load_preset_file(tmp_path / "nope.toml")


# --- folders and lookup ----------------------------------------------------------------------


def _override_rtx3080(folder: Path, description: str) -> Path:
    doc = edited(lambda d: d.update(name="rtx3080", description=description))
    return write_doc(folder, doc)


def test_env_dir_overrides_and_extends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_dir = tmp_path / "env"
    _override_rtx3080(env_dir, "from the env folder")
    write_doc(env_dir, VALID)
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv(PRESET_DIR_ENV, os.pathsep.join([str(other), "", str(env_dir)]))
    assert preset_dirs() == [builtin_preset_dir(), other, env_dir]
    by_name = {p.name: p for p in list_presets()}
    assert set(by_name) == BUILTIN_NAMES | {"mybox"}
    assert by_name["rtx3080"].description == "from the env folder"
    assert by_name["rtx3080"].source_path == env_dir / "rtx3080.toml"
    assert resolve_preset("mybox").hardware.memory_per_device_gb == 16.0


def test_preset_dir_option_overrides_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_dir, cli_dir = tmp_path / "env", tmp_path / "cli"
    _override_rtx3080(env_dir, "from the env folder")
    _override_rtx3080(cli_dir, "from --preset-dir")
    monkeypatch.setenv(PRESET_DIR_ENV, str(env_dir))
    assert preset_dirs([cli_dir]) == [builtin_preset_dir(), env_dir, cli_dir]
    assert resolve_preset("rtx3080", [cli_dir]).description == "from --preset-dir"
    assert resolve_preset("rtx3080").description == "from the env folder"


def test_missing_user_dirs_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KronosTuneError, match=r"^--preset-dir: preset directory .*nowhere' does not exist"):
        preset_dirs([tmp_path / "nowhere"])
    monkeypatch.setenv(PRESET_DIR_ENV, str(tmp_path / "gone"))
    with pytest.raises(KronosTuneError, match=rf"^{PRESET_DIR_ENV}: preset directory .*gone' does not exist"):
        list_presets()


def test_duplicate_names_in_one_folder(tmp_path: Path) -> None:
    write_doc(tmp_path, VALID, "a.toml")
    write_doc(tmp_path, VALID, "b.toml")
    with pytest.raises(KronosTuneError, match=r"b\.toml: name 'mybox' is also used by .*a\.toml"):
        list_presets([tmp_path])


def test_resolve_by_path_and_closest_names(tmp_path: Path) -> None:
    path = write_doc(tmp_path, VALID, "anything.toml")
    assert resolve_preset(str(path)).name == "mybox"
    assert resolve_preset(path).source_path == path
    with pytest.raises(KronosTuneError) as caught:
        resolve_preset("rtx308")
    message = str(caught.value)
    assert message.startswith("unknown preset 'rtx308'; did you mean: rtx3080")
    assert "rtx4090" in message and message.endswith("(kronos-tune presets lists them)")
    with pytest.raises(KronosTuneError, match=r"unknown preset 'zzzzzz'; known presets: 4x3080, .*rtx4090 "):
        resolve_preset("zzzzzz")


# --- command line ----------------------------------------------------------------------------

runner = CliRunner()
WIDE = {"COLUMNS": "200", "NO_COLOR": "1", "FORCE_COLOR": None, PRESET_DIR_ENV: None}


def _cli_app() -> Any:
    from kronos_tune.cli import app

    return app


def test_cli_table_lists_every_builtin() -> None:
    result = runner.invoke(_cli_app(), ["presets"], env=WIDE)
    assert result.exit_code == 0, result.output
    rows = {line.split()[0] for line in result.output.splitlines() if line.strip()}
    assert BUILTIN_NAMES <= rows
    assert "61.3" in result.output and "unknown" in result.output and "rtx3080.toml" in result.output


def test_cli_table_with_preset_dir(tmp_path: Path) -> None:
    path = write_doc(tmp_path / "mine", VALID)
    result = runner.invoke(_cli_app(), ["presets", "--preset-dir", str(path.parent)], env=WIDE)
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.strip().startswith("mybox"))
    assert "1 x 16 GiB" in line and "8 x 2" in line and str(path) in line


def test_cli_show_rtx3080() -> None:
    result = runner.invoke(_cli_app(), ["presets", "show", "rtx3080"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert 'name = "rtx3080"' in result.output
    assert "bf16 = 61.3" in result.output and "peak_tflops_source" in result.output
    assert "budget per device: 12,348,030,976 bytes" in result.output


def test_cli_show_from_preset_dir_before_and_after(tmp_path: Path) -> None:
    folder = write_doc(tmp_path / "mine", VALID).parent
    after = ["presets", "show", "mybox", "--preset-dir", str(folder)]
    before = ["presets", "--preset-dir", str(folder), "show", "mybox"]
    for args in (after, before):
        result = runner.invoke(_cli_app(), args, env=WIDE)
        assert result.exit_code == 0, result.output
        assert "budget per device: 16,642,998,272 bytes" in result.output


def test_main_unknown_preset_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from kronos_tune.cli import main

    with pytest.raises(SystemExit) as caught:
        main(["presets", "show", "rtx308"])
    assert caught.value.code == 2
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith("error: unknown preset 'rtx308'; did you mean: rtx3080")
    assert "Traceback" not in captured.err + captured.out


def test_console_script_unknown_preset_exit_2() -> None:
    search_path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    script = shutil.which("kronos-tune", path=search_path)
    assert script is not None, "the kronos-tune console script is not installed"
    env = {k: v for k, v in os.environ.items() if k != PRESET_DIR_ENV}
    done = subprocess.run([script, "presets", "show", "nope"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: unknown preset 'nope'")
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


@pytest.mark.parametrize("columns", ["40", "200"])
def test_show_into_a_file_is_valid_toml_whatever_the_width(tmp_path: Path, columns: str) -> None:
    """`presets show NAME > x.toml`: no wrapped description, the budget as a comment, loadable as a preset."""
    import tomllib

    env = {**{k: v for k, v in os.environ.items() if k != PRESET_DIR_ENV}, "COLUMNS": columns}
    done = subprocess.run([sys.executable, "-m", "kronos_tune.cli", "presets", "show", "rtx3080"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout  # no colour codes in a file
    saved = tmp_path / "mine" / "copy.toml"
    saved.parent.mkdir()
    saved.write_text(done.stdout.replace('name = "rtx3080"', 'name = "copy"'))
    parsed = tomllib.loads(saved.read_text())
    assert parsed["name"] == "copy" and len(parsed["description"]) > int(columns) // 2
    assert "# budget per device: 12,348,030,976 bytes" in done.stdout
    assert resolve_preset("copy", [saved.parent]).budget_bytes == resolve_preset("rtx3080").budget_bytes
