"""What `predict` and `backtest` both start from: the windows, the model (a size or checkpoint folders), the data."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kronos_core.errors import KronosError
from kronos_core.sizes import size_spec
from kronos_tune.errors import KronosTuneError


@dataclass(frozen=True)
class JobInputs:
    """size: random weights of a named size; checkpoint + tokenizer: published-format folders.
    data: files (or folders); synthetic: that many generated series instead."""

    lookback: int
    pred_len: int
    size: str | None = None
    checkpoint: Path | None = None
    tokenizer: Path | None = None
    data: tuple[Path, ...] = ()
    synthetic: int | None = None


def check_job_inputs(config: JobInputs) -> None:
    """The flags both commands share, judged before any data or weights are read."""
    if (config.size is None) == (config.checkpoint is None):
        raise KronosTuneError("give exactly one of --checkpoint DIR (with --tokenizer DIR) or --size NAME")
    if config.checkpoint is not None and config.tokenizer is None:
        raise KronosTuneError(f"--checkpoint {config.checkpoint} needs --tokenizer DIR too: the tokenizer is a "
                              "separate checkpoint folder")
    if config.size is not None:
        try:
            size_spec(config.size)
        except KronosError as error:
            raise KronosTuneError(f"--size: {error}") from None
    if config.data and config.synthetic is not None:
        raise KronosTuneError("give either --data or --synthetic N, not both")
    for flag, value in (("--lookback", config.lookback), ("--pred-len", config.pred_len)):
        if value < 1:
            raise KronosTuneError(f"{flag} {value}: must be at least 1")
