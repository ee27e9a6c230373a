"""A data file's dates checked alone, before a job claims its folder (`kronos-tune train` reads its data in the
training process, after the run folder exists): only the time column is read, and parsed as `read_kline` and
`read_panel` parse it, so an ambiguous or unreadable date column is one line with nothing written."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kronos_core.data.tables import (TIME_COLUMN_ALIASES, UNNAMED_PREFIX, first_data_line, lower_columns,
                                     parse_timestamps, time_values)
from kronos_core.deferred import deferred

pd = deferred("pandas")  # imported at its first use (kronos_core.deferred)


def _header(path: Path) -> list[str]:
    if path.suffix.lower() == ".csv":
        return [str(c) for c in pd.read_csv(path, nrows=0).columns]
    import pyarrow.parquet as parquet

    return list(parquet.read_schema(path).names)


def _time_names(names: Sequence[str]) -> list[str]:
    """The file's names of the columns the stamps come from (tables.time_values' choice), or none."""
    lowered = [n.strip().lower() for n in names]
    found = next((a for a in TIME_COLUMN_ALIASES if a in lowered), None)
    if found is None:
        return names[:1] if names and lowered[0].startswith(UNNAMED_PREFIX) else []
    wanted = {found, "time"} if found == "date" else {found}
    return [name for name, low in zip(names, lowered) if low in wanted]


def check_file_dates(paths: Sequence[Path], date_format: str | None = None) -> None:
    """Parse the time column of each file (see the module doc); a file that cannot be read, or has no time
    column, is left to the full read to describe."""
    for path in paths:
        path = Path(path)
        try:
            columns = _time_names(_header(path))
            if not columns:
                continue
            if path.suffix.lower() == ".csv":
                raw = pd.read_csv(path, usecols=columns)[columns]
            else:
                raw = pd.read_parquet(path, columns=columns)
        except (ImportError, OSError, ValueError, UnicodeDecodeError):
            continue
        names = lower_columns(raw, path)
        stamps, column, _ = time_values(raw, names, path, [], date_format)
        parse_timestamps(stamps, str(path), first_data_line(path), column=column, date_format=date_format)
