"""Which number is the day in dates written day and month first (01/07/2024: 1 July or 7 January?).

One rule for flags and files. A flag's date written so is refused (kronos_core.train.data_span: write the year
first). A file's column is read the only way all its dates allow: day first when some date's first number is
above 12, month first when some date's second one is. When every date reads both ways (each number <= 12, e.g.
``01/07/2024 09:35`` .. ``12/07/2024 15:00``) the column is refused in one line naming the file, the column and
both readings of its first such date, unless a format is given (``--date-format``, kept as ``date_format``):
pandas would guess month first, silently. A column whose dates allow neither reading (``13/07`` and ``07/13``
in one file) is refused too. Dates with the year first (2024-07-01) and typed stamps are never in question.
"""

from __future__ import annotations

import re
from datetime import datetime

from kronos_core.deferred import deferred
from kronos_core.errors import KronosError

pd = deferred("pandas")  # imported at its first use (kronos_core.deferred)

# Day and month first, in either order (05/06/2010, 18.05.2010, 05-06-10); the year, when written, last.
DAY_MONTH = re.compile(r"^\s*(?P<a>\d{1,2})(?P<sep>[/.-])(?P<b>\d{1,2})((?P=sep)(?P<year>\d{2,4}))?(?=$|[\sT])")


class AmbiguousDayMonth(KronosError):
    """A file's dates read both day first and month first; a format (--date-format) says which."""


def readings(a: int, b: int, year: str | None) -> list[str]:
    """The ISO dates `a`/`b`/`year` can be: day first, then month first (a reading with no such month left
    out; one entry when both are the same date; YEAR-MM-DD when neither is a month)."""
    year = year or "YYYY"
    if len(year) == 2:
        year = f"20{year}"
    found = [f"{year}-{month:02d}-{day:02d}" for day, month in ((a, b), (b, a)) if 1 <= month <= 12]
    return list(dict.fromkeys(found)) or [f"{year}-MM-DD"]


def check_date_format(date_format: str, where: str = "--date-format") -> None:
    """A strptime format that can read what it writes (``%d/%m/%Y %H:%M``); else one line saying so."""
    sample = datetime(2024, 7, 1, 9, 35, 0)
    try:
        ok = "%" in date_format and datetime.strptime(sample.strftime(date_format), date_format) is not None
    except ValueError:
        ok = False
    if not ok:
        raise KronosError(f"{where} {date_format!r}: not a date format that reads back what it writes; give "
                          "strptime directives such as '%d/%m/%Y %H:%M' (day first) or '%m/%d/%Y %H:%M'")


def _label(row: int, first_line: int | None) -> str:
    return f"row {row}" if first_line is None else f"line {row + first_line}"


def _formats(text: str) -> str:
    """The --date-format of each reading of `text` (pandas' own guess of its layout), for the message."""
    from pandas.tseries.api import guess_datetime_format

    found = [guess_datetime_format(text, dayfirst=day_first) for day_first in (True, False)]
    if None in found or found[0] == found[1]:
        return "--date-format with %d before %m (day first) or %m before %d (month first)"
    return f"--date-format '{found[0]}' (day first) or '{found[1]}' (month first)"


def day_first(values: pd.Series, source: str, column: str, first_line: int | None = None) -> bool:
    """Whether the text stamps `values` are read day first (see the module doc): True or False where the
    column's dates allow one reading (or hold no date written so); AmbiguousDayMonth where they allow both,
    KronosError where they allow neither. Rows are named as kronos_core.data.tables names them."""
    text = values.astype(str)
    parts = text.str.extract(DAY_MONTH)
    written = parts["a"].notna().to_numpy()
    if not written.any():
        return False
    first = parts["a"][written].astype(int).to_numpy()
    second = parts["b"][written].astype(int).to_numpy()
    rows = written.nonzero()[0]
    day_first_ok = bool((second <= 12).all())
    month_first_ok = bool((first <= 12).all())
    differ = first != second
    if day_first_ok and month_first_ok and differ.any():
        k = int(differ.argmax())
        row = int(rows[k])
        shown = text.iloc[row].strip()
        both = " or ".join(readings(int(first[k]), int(second[k]), parts["year"].iloc[row]
                                    if isinstance(parts["year"].iloc[row], str) else None))
        raise AmbiguousDayMonth(
            f"{source}: column '{column}' has dates that read both day first and month first (no number above 12 "
            f"says which): {_label(row, first_line)} {shown!r} is {both}; give {_formats(shown)}")
    if not day_first_ok and not month_first_ok:
        day_row, month_row = int(rows[int((first > 12).argmax())]), int(rows[int((second > 12).argmax())])
        raise KronosError(
            f"{source}: column '{column}' mixes day-first and month-first dates ({_label(day_row, first_line)} "
            f"{text.iloc[day_row].strip()!r} has the day first, {_label(month_row, first_line)} "
            f"{text.iloc[month_row].strip()!r} the month); write every date one way (the year first is safest)")
    return day_first_ok and not month_first_ok


def parse_with_format(values: pd.Series, date_format: str, source: str, column: str,
                      first_line: int | None = None) -> pd.Series:
    """Text stamps read with `date_format` (--date-format); the first one it does not read is one line."""
    parsed = pd.to_datetime(values, format=date_format, errors="coerce", utc=_has_offset(date_format))
    bad = (parsed.isna() & values.notna()).to_numpy()
    if bad.any():
        row = int(bad.argmax())
        raise KronosError(f"{source}: column '{column}' value {str(values.iloc[row])[:40]!r} at "
                          f"{_label(row, first_line)} does not match --date-format {date_format!r}; fix that row "
                          "or give the format the file uses")
    return parsed


def _has_offset(date_format: str) -> bool:
    """A format with %z reads stamps that may carry several UTC offsets: read as UTC."""
    return "%z" in date_format


__all__ = ["AmbiguousDayMonth", "DAY_MONTH", "check_date_format", "day_first", "parse_with_format", "readings"]
