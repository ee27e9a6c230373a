"""The report files of a benchmark run (schema: docs/report-schema.md).

    results.jsonl     one TrialResult per line, appended (flushed, fsynced) as each trial finishes
    report.json       the BenchmarkReport
    report.csv        one flat row per trial
    report.md         header, quality rule, the table, notes, the recommendation
    recommended.toml  the recommended config, for `kronos-tune train|predict --config` (the task's)
    pareto.png/.svg   time against peak memory per trial (kronos_tune.benchmark.report.picture; needs matplotlib)
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

from kronos_core.errors import one_line
from kronos_core.files import write_text_atomic
from kronos_tune.benchmark.report.shown import baseline_of, report_dict, shown_figure, table
from kronos_tune.benchmark.results import RESULTS_FILE, BenchmarkReport
from kronos_tune.benchmark.tasks import get

RUN_FILE = "run.json"
REPORT_FILES = ("report.json", "report.csv", "report.md", "recommended.toml")


def report_markdown(report: BenchmarkReport, picture: str | None = None) -> str:
    """`picture`: the line shown under the table (the embedded picture, or how to get one)."""
    title = f"# kronos-tune benchmark: {report.subject}, task {report.task}"
    lines = [title + (" (partial)" if report.partial else ""), "", report.device_line, ""]
    if report.environment.get("cpu_summary"):
        lines += [f"CPU: {report.environment['cpu_summary']}", ""]
    if report.partial:
        lines += [f"**Partial run**: {'cancelled; ' if report.cancelled else ''}missing trials: "
                  f"{', '.join(report.missing) or 'none'}. The recommendation is from the trials that ran.", ""]
    lines += [f"- {note}" for note in report.notes]
    lines += get(report.task).markdown_lines(report)
    header, rows = table(report)
    marks = {"noise": " (noise)", "bad": "", "good": "", "warn": "", "": ""}
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [(c.text + (marks[c.tone] if c.tone == "noise" and c.text.startswith("~") else ""))
                 .replace("|", "\\|") for c in row]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Δ: change vs the baseline with its 95% interval (paired: the centre of the block ratios; "
                  "sequential: the ratio of medians); ~ marks a change the decision rule does not call faster or "
                  "slower (inside the threshold or unresolved). Time: the baseline's median x the compared ratio "
                  "(the figure the Δ, the projection, the picture and the dashboard use), the trial's raw median, "
                  "measured at another time, in parentheses. Projected total: the preset's workload at the "
                  "trial's speed plus its one-time costs.", ""]
    if picture:
        lines += [picture, ""]
    for t in report.trials:
        extra = ([t.description] if t.description else []) + t.notes
        if extra:
            lines.append(f"- **{t.name}**: " + "; ".join(extra))
    if report.recommended is not None:
        rec = report.recommended
        lines += ["", f"Recommended: **{rec.source}**. Why: {rec.reason}. Run `{rec.command}`."]
    if report.cancelled:
        lines += ["", f"Cancelled: not run: {', '.join(report.not_run) or 'none'}."]
    return "\n".join(lines) + "\n"


CSV_KEYS = ("name", "stage", "status", "reason", "hardware", "val_loss", "val_loss_step", "peak_memory_bytes",
            "projected_train_time_s", "projected_predict_time_s", "mfu", "speedup", "tokens_per_step",
            "output_max_abs_diff", "wall_time_s")


def report_csv(report: BenchmarkReport) -> str:
    """One row per trial: the raw spreads, and beside each `<key>_shown` the figure the views show (the compared
    estimate), which its `delta_<key>_pct` is taken from."""
    baseline = baseline_of(report.trials)
    flat_rows = []
    for t in report.trials:
        row: dict[str, Any] = {key: getattr(t, key) for key in CSV_KEYS}
        row["changes"] = json.dumps(t.changes)
        for key in ("step_time_s", "samples_per_s", "tokens_per_s", "series_per_s"):
            spread = getattr(t, key)
            for part in ("median", "min", "max", "n"):
                row[f"{key}_{part}"] = None if spread is None else getattr(spread, part)
            row[f"{key}_shown"] = None if spread is None else shown_figure(t, key, baseline)
        for key, delta in t.deltas.items():
            row[f"delta_{key}_pct"], row[f"delta_{key}_noise"] = round(delta.pct, 3), delta.noise
        row["quality_passed"] = None if t.quality is None else t.quality.get("passed")
        flat_rows.append(row)
    columns: list[str] = []
    for row in flat_rows:
        columns += [key for key in row if key not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat_rows)
    return buffer.getvalue()


def _picture(report: BenchmarkReport, folder: Path) -> tuple[list[Path], str]:
    """pareto.png/.svg (kronos_tune.benchmark.report.picture) and report.md's line for them; a picture that cannot be
    drawn costs only the picture."""
    from kronos_tune.benchmark.report.picture import write_picture

    try:
        return write_picture(report, folder)
    except Exception as error:  # noqa: BLE001 - the reports matter more than their picture
        return [], f"No picture: drawing it failed ({one_line(error)})."


def write_reports(report: BenchmarkReport, out_dir: str | os.PathLike, results: bool = True) -> list[Path]:
    """Write report.json, report.csv, report.md, recommended.toml, the picture (pareto.png/.svg, when
    matplotlib is installed) and, with `results`, results.jsonl
    (all trials; `kronos-tune report` rebuilding a run folder keeps the run's own results.jsonl)."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    written, picture = _picture(report, folder)
    texts = {"report.json": json.dumps(report_dict(report), indent=2) + "\n",
             "report.csv": report_csv(report), "report.md": report_markdown(report, picture)}
    if results:
        texts[RESULTS_FILE] = "".join(json.dumps(t.to_dict()) + "\n" for t in report.trials)
    toml = get(report.task).recommended_toml(report)
    if toml is not None:
        texts["recommended.toml"] = toml
    for name, text in texts.items():
        write_text_atomic(folder / name, text)
        written.append(folder / name)
    return written


def evidence_line(report: BenchmarkReport, own_only: bool = False) -> str | None:
    """Each verdict with the evidence that decided it, where the task's rule names one."""
    return get(report.task).evidence_line(report, own_only)


def resolution_line(report: BenchmarkReport) -> str | None:
    """"changes under 3.8% could not be told from noise in this run (...)", where the task measures it."""
    return get(report.task).resolution_line(report)
