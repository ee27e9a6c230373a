"""kronos_core.errors.one_line: every exception said in one line, the same way in the CLI, the TUI and the reports."""

from __future__ import annotations

import pytest

from kronos_core.errors import KronosError, one_line


@pytest.mark.parametrize("error, typed, text", [
    (KronosError("data.csv: column 'close' is missing; add it"), True, "data.csv: column 'close' is missing; add it"),
    (KeyError("close"), True, "KeyError: 'close'"),
    (KeyError("close"), False, "'close'"),
    (RuntimeError("\n\n  size mismatch   for head.weight\nmore detail\n"), True,
     "RuntimeError: size mismatch for head.weight"),
    (RuntimeError(""), True, "RuntimeError"),
    (RuntimeError("   \n"), False, "RuntimeError"),
    (KronosError(""), True, "KronosError"),
])
def test_one_line(error: BaseException, typed: bool, text: str) -> None:
    assert one_line(error, typed=typed) == text


def test_a_real_failure_is_one_line() -> None:
    import json

    with pytest.raises(TypeError) as caught:
        json.dumps({"bad": {1, 2}})
    line = one_line(caught.value)
    assert line.startswith("TypeError: ") and "not JSON serializable" in line and "\n" not in line
