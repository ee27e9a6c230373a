"""The CLI's own usage errors (unknown option, missing or invalid value) are one line on stderr with exit code 2,
and help names what an option takes (INT, PATH, ...) instead of Python types."""

from __future__ import annotations

import pytest

from kronos_tune.cli import main


def run(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(args)
    return info.value.code or 0


@pytest.mark.parametrize(("args", "expected"), [
    (["train", "--bogus"], "error: kronos-tune train: No such option: --bogus"),
    (["train", "--steps", "0"], "error: kronos-tune train: Invalid value for '--steps'"),
    (["profile"], "error: kronos-tune profile: Missing option '--preset'"),
    (["presets", "show"], "error: kronos-tune presets show: Missing argument"),
    (["no-such-command"], "error: kronos-tune: No such command 'no-such-command'"),
])
def test_usage_errors_are_one_line_exit_2(args: list[str], expected: str, capsys) -> None:
    assert run(args) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(expected) and captured.err.count("\n") == 1, captured.err
    assert "--help" in captured.err and "╭" not in captured.err and captured.out == ""


@pytest.mark.parametrize("command", ["train", "profile", "predict", "dashboard", "presets"])
def test_help_shows_readable_metavars(command: str, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    assert run([command, "--help"]) == 0
    text = capsys.readouterr().out
    for python_type in ("<bool>", "<list[", "<int range>", "<str>", "<path>", "<float"):
        assert python_type not in text, (command, python_type)
    assert "--help" in text


def test_help_names_what_options_take(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    assert run(["train", "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()

    def line(option: str) -> str:
        return next(text for text in lines if f" {option} " in text)

    assert "INT" in line("--steps") and "[x>=1]" in line("--steps")
    assert "FILE" in line("--config") and "DIR" in line("--out") and "TEXT" in line("--data")
    assert not any(word in line("--overwrite") for word in ("INT", "TEXT", "PATH"))  # a flag takes no value


def test_a_command_starts_without_the_other_commands_modules() -> None:
    import subprocess
    import sys

    probe = ("import sys\nfrom kronos_tune.cli import main\ntry:\n    main(['plan', '--help'])\nexcept SystemExit:\n"
             "    pass\nprint(sorted(name for name in sys.modules if name.startswith('kronos_tune.commands.')))\n"
             "print('torch' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    modules, torch_loaded = result.stdout.strip().splitlines()[-2:]
    assert modules == "['kronos_tune.commands.common', 'kronos_tune.commands.plan']" or \
        modules == "['kronos_tune.commands.plan']", modules
    assert torch_loaded == "False"  # plan's help needs neither torch nor the planner
    import typer

    from kronos_tune.cli import app  # the whole command line is still there for whoever asks for it

    assert set(typer.main.get_command(app).commands) >= {"plan", "train", "predict", "benchmark", "presets"}
