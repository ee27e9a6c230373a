"""Out of sample: which origins a finetuned checkpoint may be scored on, from the span it trained on.

A training run writes ``data_span.json`` into its folder and into ``best/`` (kronos_core.train.data_span):
the last bar any of its training or validation windows read. An origin at time t predicts the bars after t,
so it is out of sample when t is at or after that bar; the history before t may lie inside the span (a live
forecast sees it too). With a span the backtest keeps only those origins; asking for earlier ones
(`--origins K` reaching back into the span) is refused in one line, unless `--allow-overlap`, which scores
them and marks the run. Checkpoints without a span (published weights, older runs) and synthetic data are
not checked; the report says so.

`--checkpoint` (and `--compare checkpoint=...`) may name a training run's folder: its ``best/`` is the
checkpoint, and its tokenizer is used when no tokenizer is given (kronos_tune.checkpoints, shared with
predict and train).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from kronos_core.train.data_span import SPAN_FILE, read_data_span
from kronos_tune.backtest.config import BacktestConfig, short_model_name
from kronos_tune.backtest.origins import OriginSchedule
from kronos_tune.checkpoints import resolve_pair
from kronos_tune.errors import KronosTuneError


def resolve_models(config: BacktestConfig) -> BacktestConfig:
    """Run folders replaced by their best/ checkpoint, and tokenizers filled in from the runs; every path
    checked before any work (kronos_tune.checkpoints)."""
    changes: dict[str, Any] = {}
    if config.checkpoint is not None:
        changes["checkpoint"], tokenizer = resolve_pair(config.checkpoint, config.tokenizer)
        if tokenizer is not None:
            changes["tokenizer"] = tokenizer
    compare = config.compare
    if compare is not None and compare.checkpoint is not None:
        checkpoint, tokenizer = resolve_pair(compare.checkpoint, compare.tokenizer, "--compare checkpoint=",
                                             "--compare tokenizer=")
        chosen = tokenizer or changes.get("tokenizer", config.tokenizer)
        if chosen is None:
            raise KronosTuneError(f"--compare checkpoint={compare.checkpoint}: no tokenizer for it; add "
                                  f"tokenizer=DIR, e.g. --compare checkpoint={compare.checkpoint},tokenizer=DIR")
        changes["compare"] = replace(compare, checkpoint=str(checkpoint), tokenizer=str(chosen))
    return replace(config, **changes) if changes else config


@dataclass(frozen=True)
class TrainingSpan:
    """The bars one checkpoint trained on (from its data_span.json)."""

    checkpoint: str
    file: str
    first_bar: pd.Timestamp
    last_bar: pd.Timestamp
    synthetic: bool
    data: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "file": self.file, "first_bar": str(self.first_bar),
                "last_bar": str(self.last_bar), "synthetic": self.synthetic, "data": self.data}


def training_span(checkpoint: Path) -> TrainingSpan | None:
    values = read_data_span(checkpoint)
    if values is None:
        return None
    return TrainingSpan(str(checkpoint), str(Path(checkpoint) / SPAN_FILE), pd.Timestamp(values["first_bar"]),
                        pd.Timestamp(values["last_bar"]), bool(values.get("synthetic")),
                        [str(d.get("path")) for d in values.get("data") or []])


@dataclass
class OverlapCheck:
    """What the backtest knows about its origins and the models' training spans."""

    spans: list[TrainingSpan] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # models without a span (or trained on synthetic data)
    cut: pd.Timestamp | None = None                      # origins from here on are out of sample
    allowed: bool = False                                # --allow-overlap
    origins_in_span: int = 0
    first_in_span: pd.Timestamp | None = None
    last_in_span: pd.Timestamp | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "checked": self.cut is not None,
            "out_of_sample": None if self.cut is None else self.origins_in_span == 0,
            "rule": "an origin is out of sample when it is at or after the last bar its model trained or "
                    "validated on (its predicted bars all come later)",
            "cut": None if self.cut is None else str(self.cut), "allow_overlap": self.allowed,
            "origins_in_span": self.origins_in_span,
            "first_in_span": None if self.first_in_span is None else str(self.first_in_span),
            "last_in_span": None if self.last_in_span is None else str(self.last_in_span),
            "spans": [s.to_dict() for s in self.spans], "unchecked": self.unchecked,
        }

    def marking(self) -> str | None:
        """The line that marks an overlapping run, or None."""
        if not self.origins_in_span:
            return None
        return (f"IN-SAMPLE (--allow-overlap): {self.origins_in_span} origins ({self.first_in_span} to "
                f"{self.last_in_span}) predict bars inside the training span (to {self.cut}); their scores are "
                f"not out of sample")


def models_of(config: BacktestConfig) -> list[str]:
    models = [] if config.checkpoint is None else [str(config.checkpoint)]
    if config.compare is not None and config.compare.checkpoint is not None:
        models.append(config.compare.checkpoint)
    return models


def check_spans(config: BacktestConfig, synthetic_universe: bool, note: Callable[[str, str], None]) -> OverlapCheck:
    """Read the models' spans; the cut is the latest last bar among those trained on real data."""
    check = OverlapCheck(allowed=config.allow_overlap)
    for model in models_of(config):
        span = training_span(Path(model))
        if span is None:
            check.unchecked.append(model)
            note("note", f"{short_model_name(model)} records no training span ({SPAN_FILE}): the backtest cannot "
                         f"check its origins for leakage")
        elif span.synthetic or synthetic_universe:
            check.unchecked.append(model)
            note("note", f"{short_model_name(model)} was trained on {'synthetic' if span.synthetic else 'real'} "
                         f"data, the universe is {'synthetic' if synthetic_universe else 'real'}: its span "
                         f"({span.first_bar} to {span.last_bar}) is not checked")
        else:
            check.spans.append(span)
    if check.spans:
        check.cut = max(s.last_bar for s in check.spans)
    return check


def schedule_out_of_sample(schedule: Callable[[int | None], OriginSchedule], count: int | None,
                           check: OverlapCheck, note: Callable[[str, str], None]) -> OriginSchedule:
    """The origin schedule (`schedule(count)`: schedule_origins' latest `count` origins, all with None)
    restricted to origins at or after the cut; `count` reaching into the span is refused unless the check allows it."""
    cut = check.cut
    if cut is None:
        return schedule(count)
    span = max(check.spans, key=lambda s: s.last_bar)
    where = (f"the span {short_model_name(span.checkpoint)} was trained on ({span.first_bar} to {span.last_bar}, "
             f"{span.file})")
    if check.allowed:
        chosen = schedule(count)
        _count_inside(chosen, check)
        return chosen
    every = schedule(None)
    after = [o for o in every.origins if o.timestamp >= cut]
    if count is None:
        if not after:
            raise KronosTuneError(
                f"no origin lies after {where}: the data's last origin is {every.origins[-1].timestamp}; give data "
                f"that goes on after {cut}, or --allow-overlap to score in-sample origins (marked)")
        if len(after) < len(every.origins):
            note("note", f"out of sample: the {len(after)} origins from {after[0].timestamp} on, after {where}; "
                         f"{len(every.origins) - len(after)} earlier ones left out")
        return schedule(len(after))
    chosen = schedule(count)
    inside = [o for o in chosen.origins if o.timestamp < cut]
    if inside:
        raise KronosTuneError(
            f"--origins {count}: {len(inside)} of them ({inside[0].timestamp} to {inside[-1].timestamp}) predict "
            f"bars inside {where}; ask for at most {len(after)} origins, or --allow-overlap to score them anyway "
            f"(marked in-sample)")
    return chosen


def _count_inside(schedule: OriginSchedule, check: OverlapCheck) -> None:
    inside = [o for o in schedule.origins if check.cut is not None and o.timestamp < check.cut]
    check.origins_in_span = len(inside)
    if inside:
        check.first_in_span, check.last_in_span = inside[0].timestamp, inside[-1].timestamp
