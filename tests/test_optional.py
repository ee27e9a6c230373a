"""An optional package that is not installed: one line naming it and the extra, exit code 2, no traceback.

The commands run in a fresh interpreter whose import system cannot find the hidden packages (a finder put
first on sys.meta_path, as an environment without them behaves), so what is tested is the real import path
of the command, not a stand-in for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kronos_core.errors import KronosError
from kronos_core.optional import EXTRAS, install_command, missing, require
from kronos_tune.run_logs import TENSORBOARD_DIR
from tiny_preset import tiny_train_toml

ROOT = Path(__file__).resolve().parents[1]
HIDING = """
import importlib.abc, sys
hidden = set(sys.argv[1].split(","))

class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Hide())
from kronos_tune.cli import main
main(sys.argv[2:])
"""


def run_hiding(packages: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="200", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", HIDING, packages, *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


PREDICT = ["predict", "--device", "cpu", "--synthetic", "2", "--lookback", "32", "--pred-len", "4"]
CASES = {
    "ray": (["--size", "tiny", "--runner", "ray", "--out", "f.parquet"], "--runner ray needs ray[data]"),
    "huggingface_hub": (["--checkpoint", "NeoQuasar/Kronos-small", "--tokenizer", "NeoQuasar/Kronos-Tokenizer-base"],
                        "checkpoint NeoQuasar/Kronos-small: no such folder, and loading it as a Hugging Face hub id "
                        "needs huggingface_hub"),
}


@pytest.mark.parametrize("package", sorted(CASES))
def test_a_hidden_package_a_command_asks_for_is_one_line_and_exit_2(package: str, tmp_path: Path) -> None:
    flags, words = CASES[package]
    extra = next(name for name, (_, module) in EXTRAS.items() if module.split(".")[0] == package)
    done = run_hiding(package, PREDICT + flags, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert words in done.stderr and install_command(extra) in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written before the check


def test_a_hidden_tensorboard_asked_for_is_one_line_and_by_default_training_goes_on(tmp_path: Path) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_train_toml())
    asked = run_hiding("tensorboard", ["train", "--config", str(config), "--steps", "1", "--out", "asked",
                                       "--tensorboard"], tmp_path)
    assert asked.returncode == 2 and asked.stderr.count("\n") == 1, asked.stderr
    assert asked.stderr == (f"error: --tensorboard needs tensorboard, which is not installed: "
                            f"{install_command('tensorboard')}; or leave out --tensorboard\n")
    default = run_hiding("tensorboard", ["train", "--config", str(config), "--steps", "1", "--out", "default"],
                         tmp_path)
    assert default.returncode == 0 and "Traceback" not in default.stderr, default.stderr
    assert not (tmp_path / "default" / TENSORBOARD_DIR).exists()


def test_missing_and_require_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    assert missing("plot") is None and require("plot", "a picture").__name__ == "matplotlib"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import` does for a package not installed
    assert missing("plot") == 'matplotlib is not installed (pip install "kronos-tune[plot]")'
    assert missing("plot", "matplotlib.figure") == missing("plot")
    with pytest.raises(KronosError) as caught:
        require("plot", "--plot", "matplotlib.figure", instead="leave out --plot")
    assert str(caught.value) == ('--plot needs matplotlib, which is not installed: pip install "kronos-tune[plot]"; '
                                 'or leave out --plot')
