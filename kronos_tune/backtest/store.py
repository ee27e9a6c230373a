"""Per-origin prediction files in the run folder: what makes a backtest resumable.

``predictions/<slot>/origin-0007.csv`` holds one origin's rows (symbol, closes,
predicted and realized returns; with sample paths also the close quantiles and
the CRPS), written atomically as soon as that origin is predicted. A resumed
run skips origins whose file reads back complete; the scores are always
computed from these files, so an interrupted and resumed run scores exactly
the numbers an uninterrupted one does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kronos_core.files import write_text_atomic
from kronos_tune.backtest.calibration import CALIBRATION_COLUMNS, calibration_columns
from kronos_tune.backtest.forecast import Window
from kronos_tune.backtest.metrics import PREDICTED, REALIZED

COLUMNS = ("origin", "timestamp", "symbol", "last_close", "predicted_close", "realized_close", PREDICTED, REALIZED)


def origin_path(run_path: Path, slot: str, origin: int) -> Path:
    return run_path / "predictions" / slot / f"origin-{origin:04d}.csv"


def origin_frame(windows: list[Window], timestamp: pd.Timestamp, predicted_close: np.ndarray,
                 samples: np.ndarray | None = None) -> pd.DataFrame:
    """One origin's rows; with `samples` ([rows, N] sampled closes, N >= 2) also the band's columns
    (close quantiles and CRPS, kronos_tune.backtest.calibration)."""
    last = np.array([w.last_close for w in windows])
    realized = np.array([w.realized_close for w in windows])
    frame = pd.DataFrame({
        "origin": [w.origin for w in windows], "timestamp": timestamp, "symbol": [w.symbol for w in windows],
        "last_close": last, "predicted_close": predicted_close, "realized_close": realized,
        PREDICTED: predicted_close / last - 1.0, REALIZED: realized / last - 1.0,
    }, columns=list(COLUMNS))
    if samples is not None:
        for name, values in calibration_columns(samples, realized).items():
            frame[name] = values
    return frame


def write_origin(path: Path, frame: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, frame.to_csv(index=False))


def read_origin(path: Path, expected_symbols: int) -> pd.DataFrame | None:
    """The saved origin, or None when missing or not the expected size (then it is predicted again)."""
    if not path.is_file():
        return None
    try:
        frame = pd.read_csv(path, dtype={"symbol": str})
    except (OSError, ValueError, pd.errors.EmptyDataError):
        return None
    if list(frame.columns) not in (list(COLUMNS), [*COLUMNS, *CALIBRATION_COLUMNS]) or len(frame) != expected_symbols:
        return None
    return frame


def has_band(frame: pd.DataFrame) -> bool:
    """Whether a saved origin holds the sample band's columns."""
    return all(name in frame.columns for name in CALIBRATION_COLUMNS)
