"""`kronos-tune config convert`: a training file (an upstream finetune_csv YAML) as this project's TOML, each
key under a comment that says where it came from."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import tomli_w

from kronos_core.train.train_file import TrainFile

WIDTH = 110


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent="# ", subsequent_indent="#   ")


def _lines(values: dict[str, Any], sources: dict[str, str]) -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        if value is None:
            continue
        if key in sources:
            out += _comment(f"from {sources[key]}")
        out.append(tomli_w.dumps({key: value}, multiline_strings=False).strip())
    return out


def train_file_toml(job: TrainFile, header: list[str] | None = None) -> str:
    """The TOML text of `job`: its header comment, the keys the phases share, then one table per phase.
    `header` lines (without '#') come first, e.g. the changes a benchmark recommends."""
    lines: list[str] = [f"# {line}" if line else "#" for line in header or []]
    if job.upstream:
        lines += _comment(f"kronos-tune training config converted from the upstream Kronos finetune_csv config "
                          f"{job.path} (kronos-tune config convert); train it with kronos-tune train --config "
                          f"THIS.toml")
        if job.windows is not None:
            lines += _comment(f"an epoch is one pass over the data's {job.windows[0]:,} training windows, as "
                              f"upstream counts it; every one of its {job.windows[1]:,} validation windows is "
                              f"evaluated. Counted when converted: after changing the data, convert again or set "
                              f"samples_per_epoch and eval_samples yourself")
        for note in job.notes:
            lines += _comment(note)
    if len(job.phases) == 2:
        lines += _comment("two phases: the tokenizer, then the predictor on the tokenizer it trained (RUN/tokenizer "
                          "then RUN/predictor); the tables hold each phase's own keys")
    lines.append("")
    shared = dict(job.shared)
    if len(job.phases) == 1:  # one phase: flat keys, what names it
        phase, own = next(iter(job.phases.items()))
        shared = {"what": phase, **shared, **own}
    lines += _lines(shared, job.sources)
    if len(job.phases) == 2:
        for phase, own in job.phases.items():
            lines += ["", f"[{phase}]", *_lines(own, job.sources)]
    return "\n".join(lines) + "\n"


def default_target(source: Path) -> Path:
    return source.with_suffix(".toml")


__all__ = ["default_target", "train_file_toml"]
