"""A checkpoint as a user names it, checked before any work: one resolver for predict, backtest and train.

What a `--checkpoint` (`--compare checkpoint=`, `predictor_dir`) may name:

- a checkpoint folder (``config.json`` + ``model.safetensors``), used as it is;
- a training run's folder (``kronos-tune train`` writes one): its ``best/`` is the checkpoint, and the
  tokenizer it trained with (the run's ``tokenizer_dir``, or the random-init one it saved in ``tokenizer/``)
  is used when no tokenizer is given; a ``--what both`` run's folder means its predictor stage;
- a Hugging Face hub id (``OWNER/NAME[@REVISION]``), left to ``kronos_core.hub`` to find.

A path that does not exist, a file, a run folder without ``best/`` (no evaluation finished yet) and a folder
that is neither are one `KronosTuneError` line naming the flag, before any data is read or folder made.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path

from kronos_core.errors import KronosError
from kronos_core.files import load_toml
from kronos_core.hub import CONFIG_NAME, parse_hub_id
from kronos_tune.errors import KronosTuneError

BEST = "best"
RUN_CONFIG = "config.toml"  # a training run's TrainConfig, next to its best/


@dataclass(frozen=True)
class Resolved:
    """The folder (or hub id) to load, and the tokenizer of its training run (None: not from a run)."""

    checkpoint: Path
    tokenizer: Path | None = None


def _is_checkpoint(folder: Path) -> bool:
    return (folder / CONFIG_NAME).is_file()


def _is_run(folder: Path) -> bool:
    return (folder / RUN_CONFIG).is_file() or (folder / BEST).is_dir() or (folder / "run.json").is_file()


def _tokenizer_of_run(run: Path) -> Path | None:
    """The tokenizer a training run's predictor was trained with: its tokenizer_dir, else its saved one."""
    try:
        values = load_toml(run / RUN_CONFIG, what="training config")
    except KronosError:
        values = {}
    if values.get("tokenizer_dir"):
        return Path(values["tokenizer_dir"])
    return run / "tokenizer" if _is_checkpoint(run / "tokenizer") else None


def _named(flag: str, given: str) -> str:
    return f"{flag}{given}" if flag.endswith("=") else f"{flag} {given}"


def _is_hub_id(text: str) -> bool:
    """OWNER/NAME[@REVISION] that is no local path: its OWNER is not a folder here either (runs/x is a typo of
    a run folder, not a repo on the hub)."""
    return parse_hub_id(text) is not None and not Path(text.split("/", 1)[0]).is_dir()


def _missing(flag: str, given: str, path: Path) -> KronosTuneError:
    parent = path.parent if str(path.parent) else Path(".")
    names = sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []
    close = [n for n in names if n.startswith(path.name)] or difflib.get_close_matches(path.name, names, n=3)
    hint = f"; did you mean {' or '.join(str(parent / n) for n in close[:3])}?" if close else \
        "; give a checkpoint folder (config.json + model.safetensors), a training run's folder or a hub id"
    return KronosTuneError(f"{_named(flag, given)} does not exist{hint}")


def resolve_checkpoint(given: str | os.PathLike, flag: str = "--checkpoint", stage: str = "predictor") -> Resolved:
    """The checkpoint `given` names (see the module doc), checked now; `flag` names it in errors ("--checkpoint",
    "--compare checkpoint=", "predictor_dir"); `stage`: which stage of a `--what both` run folder it means."""
    text = os.fspath(given)
    path = Path(text).expanduser()
    if not path.exists():
        if _is_hub_id(text):
            return Resolved(Path(text))
        raise _missing(flag, text, path)
    if not path.is_dir():
        raise KronosTuneError(f"{_named(flag, text)}: {path} is a file; give a checkpoint folder "
                              f"(config.json + model.safetensors) or a training run's folder")
    if _is_checkpoint(path):
        from_run = path.name == BEST and (path.parent / RUN_CONFIG).is_file()
        return Resolved(path, _tokenizer_of_run(path.parent) if from_run else None)
    if (path / stage / BEST).is_dir() or (path / stage / RUN_CONFIG).is_file():  # a `--what both` run
        path = path / stage
    if _is_checkpoint(path / BEST):
        return Resolved(path / BEST, _tokenizer_of_run(path) if stage == "predictor" else None)
    if _is_run(path):
        raise KronosTuneError(f"{_named(flag, text)}: the training run {path} has no {BEST}/ checkpoint yet (it "
                              f"is written at the first evaluation); train it further or name another checkpoint")
    raise KronosTuneError(f"{_named(flag, text)}: {path} has no {CONFIG_NAME}: neither a checkpoint folder "
                          f"({CONFIG_NAME} + model.safetensors) nor a training run's folder (with {BEST}/)")


def resolve_pair(checkpoint: str | os.PathLike | None, tokenizer: str | os.PathLike | None,
                 flag: str = "--checkpoint", tokenizer_flag: str = "--tokenizer") -> tuple[Path | None, Path | None]:
    """(checkpoint, tokenizer) to load: both checked now; the tokenizer, when not given, that of the
    checkpoint's training run (None when it has none)."""
    found = None if checkpoint is None else resolve_checkpoint(checkpoint, flag)
    chosen = None if tokenizer is None else resolve_checkpoint(tokenizer, tokenizer_flag, stage="tokenizer").checkpoint
    if chosen is None and found is not None:
        chosen = found.tokenizer
    return (None if found is None else found.checkpoint), chosen
