"""A training file: one phase (flat TrainConfig keys) or two (`[tokenizer]` and `[predictor]` tables).

    job = load_train_file("user.toml")      # or an upstream finetune_csv YAML (kronos_core.train.upstream)
    job.config("predictor")                 # the TrainConfig of one phase: shared keys, then the phase's own

A TOML with phase tables trains the tokenizer, then the predictor on the tokenizer it trained; each table holds
the keys that differ per phase (epochs, lr, ...), the top level the keys both share. An upstream YAML becomes
the same shape, its epoch one pass over the training windows of its data (counted here: samples_per_epoch and
eval_samples are set from the data).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kronos_core.errors import KronosError
from kronos_core.files import load_toml
from kronos_core.train.config import TrainConfig
from kronos_core.train.upstream import PHASES, read_upstream

YAML_SUFFIXES = (".yaml", ".yml")


@dataclass
class TrainFile:
    """What a training file holds. `phases`: the phases it trains in order with their own keys ({} for a flat
    file, which trains its `what`); `upstream`: read from a finetune_csv YAML; `sources`: for an upstream file,
    the upstream keys each key came from; `windows`: (train, val) windows counted for an upstream file."""

    path: Path
    shared: dict[str, Any]
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    upstream: bool = False
    label: str | None = None
    notes: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    windows: tuple[int, int] | None = None

    @property
    def two_phases(self) -> bool:
        return len(self.phases) == 2

    @property
    def what(self) -> str:
        """tokenizer, predictor or both."""
        if self.two_phases:
            return "both"
        return next(iter(self.phases)) if self.phases else str(self.shared.get("what", "predictor"))

    def values(self, phase: str | None = None) -> dict[str, Any]:
        """The flat keys of one phase (default: the first it trains)."""
        phase = phase or (next(iter(self.phases)) if self.phases else None)
        if phase is not None and self.phases and phase not in self.phases:
            raise KronosError(f"{self.path}: trains {' and '.join(self.phases)}, not the {phase}")
        values = dict(self.shared)
        if phase is not None and self.phases:
            values.update(self.phases[phase])
            values["what"] = phase
        return values

    def config(self, phase: str | None = None) -> TrainConfig:
        return TrainConfig.from_dict(self.values(phase), source=str(self.path))


def load_train_file(path: str | Path) -> TrainFile:
    """A TOML (flat or with phase tables) or an upstream YAML; every phase's TrainConfig is checked now."""
    path = Path(path)
    job = _read_yaml(path) if path.suffix.lower() in YAML_SUFFIXES else _read_toml(path)
    _fill_phases(job)
    for phase in job.phases or [None]:
        job.config(phase)
    return job


def _fill_phases(job: TrainFile) -> None:
    """A key one phase sets and the other does not: the other takes the shared value (or the default, which
    for lr and grad_clip is the phase's own), so no phase inherits the other's value."""
    defaults = {spec.name: spec.default for spec in dataclasses.fields(TrainConfig)
                if spec.default_factory is dataclasses.MISSING}
    own = {key for keys in job.phases.values() for key in keys}
    for keys in job.phases.values():
        for key in own - set(keys):
            keys[key] = job.shared.get(key, defaults.get(key))


def _read_toml(path: Path) -> TrainFile:
    data = load_toml(path, what="training config")
    if isinstance(data.get("predict"), dict):  # e.g. the predict benchmark's recommended.toml
        raise KronosError(f"{path}: a prediction config (a [predict] table), not a training config; predict "
                          f"with `kronos-tune predict --config {path}`, or give train a file of TrainConfig "
                          f"keys (`kronos-tune config keys`)")
    phases: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if not isinstance(value, dict):
            continue
        if key not in PHASES:
            raise KronosError(f"{path}: [{key}] is a table; a training config is flat key = value lines, with "
                              f"only [tokenizer] and [predictor] tables for the keys of each phase; move its keys "
                              f"to the top level")
        if "what" in value:
            raise KronosError(f"{path}: [{key}] sets what; the table's name is the phase, remove that line")
    shared = {key: value for key, value in data.items() if not isinstance(value, dict)}
    for phase in PHASES:  # training order, whatever order the file writes them in
        if isinstance(data.get(phase), dict):
            phases[phase] = dict(data[phase])
    if phases and "what" in shared:
        raise KronosError(f"{path}: what = {shared['what']!r} beside [{'] and ['.join(phases)}] tables; the tables "
                          f"name the phases, remove the what line")
    return TrainFile(path, shared, phases)


def _read_yaml(path: Path) -> TrainFile:
    from kronos_core.train.loading import count_windows

    mapped = read_upstream(path)
    job = TrainFile(path, mapped.shared, mapped.phases, upstream=True, label=mapped.label,
                    notes=[note for note in [mapped.note()] if note], sources=dict(mapped.sources))
    counted = count_windows(TrainConfig.from_dict(job.values(), source=str(path)))
    if counted.train < 1 or counted.val < 1:
        raise KronosError(f"{path}: data.data_path {mapped.shared['data'][0]} holds {counted.train} training and "
                          f"{counted.val} validation windows of {counted.window_length} rows (lookback_window + "
                          f"predict_window + 1); shorten the windows or give more data")
    job.shared["samples_per_epoch"] = counted.train
    job.shared["eval_samples"] = counted.val
    job.sources["samples_per_epoch"] = "the training windows of data.data_path (upstream's epoch is one pass)"
    job.sources["eval_samples"] = "the validation windows of data.data_path (upstream evaluates every one)"
    job.windows = (counted.train, counted.val)
    return job


__all__ = ["TrainFile", "YAML_SUFFIXES", "load_train_file"]
