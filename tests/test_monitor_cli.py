"""`kronos-tune monitor`: in-process through CliRunner and as a real subprocess."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import psutil
import pytest
from rich.console import Console
from typer.testing import CliRunner

from kronos_tune.cli import app, main
from kronos_tune.commands.monitor import render
from kronos_tune.errors import KronosTuneError
from kronos_tune.telemetry.nvml import GpuSnapshot
from kronos_tune.telemetry.sampler import Sampler, Snapshot
from machine import real_nvidia_gpu_present

runner = CliRunner()


NO_GPU = not real_nvidia_gpu_present()


def _command() -> list[str]:
    script = shutil.which("kronos-tune")
    return [script] if script else [sys.executable, "-m", "kronos_tune.cli"]


def _check_sample_line(line: str) -> dict:
    sample = json.loads(line)
    assert sample["host"]["ram_total_bytes"] == psutil.virtual_memory().total
    assert len(sample["host"]["cpu_percent_per_core"]) == psutil.cpu_count()
    if NO_GPU:
        assert sample["gpus"] == [] and "NVML" in sample["gpu_unavailable_reason"]
    cpu = sample["cpu_features"]  # this machine's, read from /proc/cpuinfo
    assert cpu["cores"] >= 1 and cpu["native_bf16"] == (cpu["amx_bf16"] or cpu["avx512_bf16"] or cpu["arm_bf16"])
    return sample


def test_json_lines_in_process() -> None:
    result = runner.invoke(app, ["monitor", "--json", "--duration", "0.3", "--interval", "0.1"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert 2 <= len(lines) <= 4  # ticks at 0, 0.1, 0.2, 0.3 s; late ticks are skipped
    stamps = [_check_sample_line(line)["timestamp_s"] for line in lines]
    assert stamps == sorted(stamps)


def test_live_view_in_process() -> None:
    result = runner.invoke(app, ["monitor", "--duration", "0.2", "--interval", "0.1"])
    assert result.exit_code == 0, result.output
    assert "RAM" in result.stdout and "Swap" in result.stdout and "Process tree RSS" in result.stdout
    assert "cpu0" in result.stdout
    assert "CPU: " in result.stdout and ("native bf16" in result.stdout or "bf16 emulated" in result.stdout)
    if NO_GPU:
        assert "No NVIDIA GPU: NVML" in result.stdout


def test_render_shows_a_table_per_gpu() -> None:
    host = Sampler(interval_s=0.5).sample_once().host
    gpus = tuple(
        GpuSnapshot(i, "NVIDIA H100 80GB HBM3", 7 * 2**30, 80 * 2**30, 87.0, 64.0, None, 700.0, 4 * 2**30, 0, ())
        for i in range(2)
    )
    snapshot = Snapshot(1.0, host, gpus, None, None, 0.001)
    console = Console(width=120, record=True, file=open("/dev/null", "w"))
    console.print(render(snapshot, 0.5, 1234))
    text = console.export_text()
    assert "GPU 0: NVIDIA H100 80GB HBM3" in text and "GPU 1: NVIDIA H100 80GB HBM3" in text
    assert "7.00 GiB / 80.00 GiB" in text and "87 %" in text and "64 °C" in text
    assert "n/a / 700 W" in text  # power not readable, limit known
    assert "No NVIDIA GPU" not in text
    assert "Process tree RSS (pid 1234)" in text


GRANDCHILD = "b = b'x' * 50_000_000; print('ready', flush=True); import time; time.sleep(60)"
CHILD = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}]).wait()"


def test_pid_option_measures_that_process_tree() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        arguments = ["monitor", "--json", "--duration", "0.1", "--interval", "0.1", "--pid", str(child.pid)]
        result = runner.invoke(app, arguments)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert result.exit_code == 0, result.output
    host = json.loads(result.stdout.splitlines()[0])["host"]
    assert host["child_count"] == 1  # the grandchild, not the test process's children
    assert host["process_tree_rss_bytes"] - host["process_rss_bytes"] > 30_000_000


def test_unknown_pid_is_a_one_line_error() -> None:
    result = runner.invoke(app, ["monitor", "--json", "--pid", "4000000"])
    assert isinstance(result.exception, KronosTuneError)
    assert "pid 4000000" in str(result.exception) and "\n" not in str(result.exception)


@pytest.mark.parametrize("interval", ["0", "-1", "0.01", "61"])
def test_bad_interval_raises_one_line_error(interval: str) -> None:
    result = runner.invoke(app, ["monitor", "--json", "--interval", interval])
    assert isinstance(result.exception, KronosTuneError)
    assert "--interval" in str(result.exception) and "\n" not in str(result.exception)
    assert result.stdout == ""


def test_bad_duration_through_main_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["monitor", "--json", "--duration", "0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --duration") and err.count("\n") == 1


def test_subprocess_json_lines() -> None:
    done = subprocess.run(
        [*_command(), "monitor", "--json", "--duration", "1", "--interval", "0.2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert 2 <= len(lines) <= 6  # ticks at 0, 0.2 ... 1.0 s
    stamps = [_check_sample_line(line)["timestamp_s"] for line in lines]
    assert stamps == sorted(stamps)


def test_subprocess_bad_interval_exits_2_without_traceback() -> None:
    done = subprocess.run(
        [*_command(), "monitor", "--interval", "0"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("error: --interval") and done.stderr.count("\n") == 1


def default_sigint() -> None:
    """In the child before exec: a shell starts background jobs with SIGINT ignored, and an ignored signal
    stays ignored across exec, so without this the child would never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_subprocess_ctrl_c_exits_0() -> None:
    process = subprocess.Popen(
        [*_command(), "monitor", "--json", "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    try:
        assert process.stdout is not None
        _check_sample_line(process.stdout.readline())  # it is running and sampling
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err and "Aborted" not in err
