"""Bad input through the console entry point, as a user meets it."""

from __future__ import annotations

import pytest

from kronos_tune.cli import main


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `kronos-tune argv`, which must exit 2 with one line on stderr; that line."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error and "\n" not in error
    return error


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run `kronos-tune argv`: (exit code, stdout, stderr)."""
    try:
        main(argv)
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
