"""kronos_core.validate: one checker for config mappings, driven by the dataclass's real annotations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest

from kronos_core.errors import KronosError
from kronos_core.validate import check_fields, check_value, describe


@dataclass
class Inner:
    depth: int = 1


@dataclass
class Settings:
    count: int = 3
    rate: float = 0.5
    enabled: bool = False
    name: str = "x"
    folder: str | None = None
    limit: Optional[int] = None  # noqa: UP007 - the old spelling must work too
    mode: Literal["fast", "exact"] = "fast"
    betas: tuple[float, float] = (0.9, 0.95)
    sizes: tuple[int, ...] = ()
    files: list[str] = field(default_factory=list)
    inner: Inner = field(default_factory=Inner)


def test_good_values_come_back_converted() -> None:
    values = check_fields({"count": 2, "rate": 1, "enabled": True, "folder": None, "limit": 7, "mode": "exact",
                           "betas": [0.8, 1], "sizes": [1, 2, 3], "files": ["a"], "inner": {"depth": 4}},
                          Settings, where="s.toml")
    assert values["rate"] == 1.0 and isinstance(values["rate"], float)
    assert values["betas"] == (0.8, 1.0) and values["sizes"] == (1, 2, 3)
    assert values["inner"] == {"depth": 4} and values["limit"] == 7


@pytest.mark.parametrize("values, message", [
    ({"count": "3"}, "s.toml: count must be an integer (got string '3'); write a whole number, e.g. count = 1"),
    ({"count": True}, "count must be an integer (got boolean True)"),
    ({"count": 2.0}, "count must be an integer (got float 2.0)"),
    ({"enabled": 1}, "enabled must be true or false (got integer 1); write enabled = true or enabled = false"),
    ({"rate": "fast"}, "rate must be a number (got string 'fast'); write it without quotes"),
    ({"rate": False}, "rate must be a number (got boolean False)"),
    ({"name": 5}, "name must be a string (got integer 5); write it in quotes"),
    ({"folder": 5}, "folder must be a string or left out (got integer 5)"),
    ({"limit": "7"}, "limit must be an integer or left out (got string '7')"),
    ({"mode": "slow"}, "mode must be one of 'fast', 'exact' (got string 'slow'); use one of \"fast\", \"exact\""),
    ({"betas": [0.9]}, "betas must be a list of two numbers (got array [0.9])"),
    ({"betas": [0.9, "x"]}, "betas must be a list of two numbers (got array [0.9, 'x'])"),
    ({"sizes": [1, "2"]}, "sizes must be a list of integers"),
    ({"files": "a.csv"}, "files must be a list of strings (got string 'a.csv')"),
    ({"inner": 3}, "inner must be a table (got integer 3); write it as a [inner] table"),
    ({"inner": {"depth": "deep"}}, "inner.depth must be an integer (got string 'deep')"),
    ({"inner": {"dept": 2}}, "unknown key 'inner.dept' (did you mean 'inner.depth'?)"),
    ({"cuont": 1, "zzz": 2}, "unknown keys 'cuont' (did you mean 'count'?), 'zzz'; remove them (valid keys: count,"),
])
def test_each_problem_is_one_line_naming_the_key_the_type_and_what_it_got(values: dict, message: str) -> None:
    with pytest.raises(KronosError) as info:
        check_fields(values, Settings, where="s.toml")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).startswith("s.toml: ")


def test_any_annotation_is_described() -> None:
    assert describe(dict[str, int]) == "a table"
    assert describe(list[float]) == "a list of numbers"
    assert describe(int | str) == "an integer or a string"
    assert describe(tuple[int, str]) == "a list of an integer, a string"


def test_the_callers_error_type_and_example() -> None:
    class Mine(KronosError):
        pass

    with pytest.raises(Mine, match=r"batch must be an integer \(got float 8.5\); write a whole number, e.g. "
                                   r"batch = 64"):
        check_value("batch", 8.5, int, where="preset.toml", example=64, error=Mine)
