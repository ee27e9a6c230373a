"""CPU capability detection from its flags (faked both ways), and what it decides: the bf16 trials of the
benchmark's plans, a preset's fp16 on a CPU, and the note `predict --amp bf16` prints on a CPU without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kronos_core.cpu_features
from kronos_core.cpu_features import NO_NATIVE_BF16, detect_cpu_features, features_from_flags, parse_cpuinfo
from kronos_tune.benchmark.options import BenchmarkOptions
from kronos_tune.benchmark.predict.trial_list import plan_predict
from kronos_tune.benchmark.train.trial_list import plan_train
from kronos_tune.presets import resolve_preset
from kronos_tune.workloads import train_config_from_preset

REPO = Path(__file__).resolve().parent.parent
SAPPHIRE_RAPIDS = "fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8".split()
EPYC_ROME = "fpu sse2 avx avx2 fma".split()
GENOA = "fpu sse2 avx avx2 avx512f avx512_bf16".split()


def test_flags_decide_native_bf16_amx_and_vector_width() -> None:
    amx = features_from_flags(SAPPHIRE_RAPIDS, cores=2, model="Intel Xeon")
    assert amx.native_bf16 and amx.amx_bf16 and amx.amx_int8 and amx.vector_width == "AVX-512"
    assert amx.summary() == "Intel Xeon, 2 cores, AVX-512, native bf16 (AMX-BF16 + AVX512-BF16), AMX int8"
    avx2 = features_from_flags(EPYC_ROME, cores=2)
    assert not avx2.native_bf16 and not avx2.amx_int8 and avx2.vector_width == "AVX2"
    assert "bf16 emulated (no AMX or AVX512-BF16)" in avx2.summary()
    genoa = features_from_flags(GENOA, cores=4)
    assert genoa.native_bf16 and not genoa.amx_bf16 and genoa.bf16_units() == "AVX512-BF16"
    assert features_from_flags(["fp", "asimd", "bf16"], cores=8).native_bf16  # Arm's BF16
    assert json.loads(json.dumps(amx.to_dict()))["native_bf16"] is True


def test_cpuinfo_text_gives_the_first_processors_flags_and_model() -> None:
    text = ("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 fma\n\n"
            "processor\t: 1\nmodel name\t: other\nflags\t\t: avx512f\n")
    assert parse_cpuinfo(text) == (["fpu", "avx2", "fma"], "AMD EPYC 7B13")
    machine = detect_cpu_features()  # this machine, whatever it is: a real read of /proc/cpuinfo
    assert machine.cores >= 1 and machine.native_bf16 == (machine.amx_bf16 or machine.avx512_bf16 or
                                                           machine.arm_bf16)


@pytest.mark.parametrize("flags, native", [(SAPPHIRE_RAPIDS, True), (EPYC_ROME, False)])
def test_bf16_trials_follow_the_cpu_flags_under_auto(flags: list[str], native: bool) -> None:
    preset, options, cpu = resolve_preset("cpu"), BenchmarkOptions(), features_from_flags(flags, cores=2)
    assert preset.hardware.bf16_supported == "auto"
    train = {s.name: s for s in plan_train(preset, options, "cpu", cpu)}
    predict = {s.name: s for s in plan_predict(preset, options, "cpu", cpu)}
    for spec in (train["bf16"], predict["bf16"], predict["bf16-weights"]):
        assert spec.skip_reason == (None if native else NO_NATIVE_BF16)
    gpu = resolve_preset("rtx4090")  # a GPU preset run on this CPU: the CPU decides, not the preset's GPU
    assert gpu.hardware.bf16_supported == "auto"
    assert next(s for s in plan_train(gpu, options, "cpu", cpu) if s.name == "bf16").skip_reason == \
        (None if native else NO_NATIVE_BF16)
    if native:
        assert train["bf16"].config.amp == "bf16" and predict["bf16"].config.amp == "bf16"
        assert predict["bf16-weights"].config.weight_dtype == "bf16" and predict["bf16-weights"].config.amp == "none"


def test_a_preset_forcing_bf16_runs_it_with_the_emulation_note(tmp_path: Path) -> None:
    from tiny_preset import write_tiny_preset

    folder = write_tiny_preset(tmp_path, "tiny-forced", bf16_supported=True)
    preset = resolve_preset(str(folder / "tiny-forced.toml"))
    plain = features_from_flags(EPYC_ROME, cores=2)
    spec = next(s for s in plan_predict(preset, BenchmarkOptions(), "cpu", plain) if s.name == "bf16")
    assert spec.skip_reason is None and NO_NATIVE_BF16 in spec.description
    off = write_tiny_preset(tmp_path / "off", "tiny-off", bf16_supported=False)
    amx = features_from_flags(SAPPHIRE_RAPIDS, cores=2)
    spec = next(s for s in plan_train(resolve_preset(str(off / "tiny-off.toml")), BenchmarkOptions(), "cpu", amx)
                if s.name == "bf16")
    assert spec.skip_reason == "the preset turns bf16 off (hardware.bf16_supported = false)"


def _fake_cpuinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str]) -> None:
    """The detection's input, /proc/cpuinfo, as a CPU with these flags writes it."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: faked\nflags\t\t: {' '.join(flags)}\n")
    monkeypatch.setattr(kronos_core.cpu_features, "CPUINFO", cpuinfo)


@pytest.mark.parametrize("flags, native", [(SAPPHIRE_RAPIDS, True), (EPYC_ROME, False)])
def test_a_presets_fp16_on_the_cpu_follows_its_bf16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     flags: list[str], native: bool) -> None:
    from tiny_preset import write_tiny_preset

    _fake_cpuinfo(tmp_path, monkeypatch, flags)
    assert detect_cpu_features().native_bf16 is native
    folder = write_tiny_preset(tmp_path, "tiny-fp16")
    path = folder / "tiny-fp16.toml"
    path.write_text(path.read_text().replace('bf16_supported = false', 'bf16_supported = "auto"')
                    .replace('amp = "none"', 'amp = "fp16"'))
    config, notes = train_config_from_preset(resolve_preset(str(path)))
    assert config.amp == ("bf16" if native else "none")
    mapped = [note for note in notes if "amp fp16 needs a CUDA device" in note]
    assert len(mapped) == 1 and (native or NO_NATIVE_BF16 in mapped[0])
    # a preset forcing bf16 on a CPU without it: bf16 runs, with one note that it is emulated
    path.write_text(path.read_text().replace('bf16_supported = "auto"', "bf16_supported = true"))
    config, notes = train_config_from_preset(resolve_preset(str(path)))
    emulated = [note for note in notes if NO_NATIVE_BF16 in note]
    assert config.amp == "bf16" and len(emulated) == (0 if native else 1)


def test_predict_amp_bf16_on_an_emulating_cpu_prints_one_note_and_runs(tmp_path: Path) -> None:
    if detect_cpu_features().native_bf16:
        pytest.skip("this CPU has native bf16: no note to print")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "kronos_tune.cli", "predict", "--size", "tiny", "--synthetic", "2",
               "--lookback", "32", "--pred-len", "4", "--device", "cpu", "--amp", "bf16", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if NO_NATIVE_BF16 in line]
    assert lines == [f"note: --amp bf16: {NO_NATIVE_BF16}; the run goes on"]
    assert json.loads(done.stdout)["series_predicted"] == 2


def test_predict_amp_fp16_on_the_cpu_is_a_one_line_refusal(capsys: pytest.CaptureFixture[str]) -> None:
    from kronos_tune.cli import main

    with pytest.raises(SystemExit) as caught:
        main(["predict", "--size", "tiny", "--synthetic", "2", "--lookback", "32", "--pred-len", "4",
              "--device", "cpu", "--amp", "fp16"])
    err = capsys.readouterr().err.strip().splitlines()
    assert caught.value.code == 2 and len(err) == 1 and "fp16" in err[0] and "CUDA" in err[0]
