"""One rule for every delta: the change between the two figures shown, once every estimate is applied.

A constructed paired run (block times built here, summarized by the real rule) where the raw medians disagree
with the paired ratios: the baseline's blocks ran faster than its own row (the machine sped up), fused-adamw's
raw tokens/s is far above the baseline's while paired it is 0.7% faster, dataloader pays a warm-up so its
projected total is not its step time's, and bigger-batch runs twice the tokens per step. Every view is rendered
(the CLI table, report.md, report.json, the dashboard's results table, the picture's data) and each delta it
prints is checked, sign and size, against the two figures it prints beside it, within the rounding shown.
"""

from __future__ import annotations

import json
import random
import re

import pytest
from rich.console import Console

from kronos_tune.benchmark import Spread, TrialResult
from kronos_tune.benchmark.results import BenchmarkReport, TrialKind

GIB = 2**30
BASE_S, TOKENS = 0.370, 1600
EPOCHS, SAMPLES = 2, 4096


def _result(name: str, kind: TrialKind, times: list[float], tokens: int = TOKENS, stage: str = "single",
            **fields) -> TrialResult:
    result = TrialResult(name, stage, "ok", {}, step_time_s=Spread.of(times), step_times_s=list(times),
                         samples_per_s=Spread.of([tokens / 100 / t for t in times]),
                         tokens_per_s=Spread.of([tokens / t for t in times]), tokens_per_step=tokens,
                         peak_memory_bytes=int(fields.pop("peak_gib", 2.4) * GIB), val_loss=fields.pop("loss", 2.0),
                         config={"epochs": EPOCHS, "samples_per_epoch": SAMPLES, "batch_size": tokens // 100},
                         **fields)
    result.set_kind(kind)
    return result


def _paired(name: str, kind: TrialKind, ratio: float, rounds: int = 16, tokens: int = TOKENS,
            block_base_s: float = 0.320, seed: int = 3, **fields) -> TrialResult:
    """A trial timed in alternating blocks against a baseline running at `block_base_s` a step (not the
    baseline row's own median): its paired ratio is `ratio` per token, its raw median is something else."""
    rng = random.Random(seed)
    blocks = []
    for index in range(rounds):
        base = block_base_s * (1 + rng.uniform(-0.004, 0.004))
        trial = block_base_s * ratio * tokens / TOKENS * (1 + rng.uniform(-0.004, 0.004))
        blocks.append({"round": index + 1, "first": "trial" if index % 2 else "baseline", "trial_s": [trial],
                       "baseline_s": [base]})
    times = [block["trial_s"][0] for block in blocks]
    return _result(name, kind, times, tokens, design="paired", blocks=blocks, **fields)


@pytest.fixture(scope="module")
def report() -> BenchmarkReport:
    from kronos_tune.benchmark.report.shown import summarize

    rng = random.Random(1)
    trials = [
        _result("baseline", TrialKind("reference"), [BASE_S * (1 + rng.uniform(-0.003, 0.003)) for _ in range(9)],
                stage="baseline"),
        _paired("noise-probe", TrialKind("baseline-repeat"), 1.0, stage="baseline", seed=4),
        _paired("fused-adamw", TrialKind("speed", "optimizer", "close"), 0.993, seed=5, peak_gib=2.45),
        _paired("dataloader", TrialKind("speed", "dataloader", "equivalent"), 0.80, seed=6, loss=2.001,
                warmup_times_s=[9.0, 0.4]),
        _paired("bigger-batch", TrialKind("optimization", "batch"), 0.90, tokens=2 * TOKENS, seed=7, peak_gib=4.1,
                loss=1.98),
    ]
    raw = BenchmarkReport(preset="cpu", task="train", device="cpu", device_line="device: cpu (2 cores)",
                         budget_bytes=8 * GIB, budget_mode="simulated", trials=trials,
                         planned=[t.name for t in trials])
    return summarize(raw, None)


# What each view prints, parsed back -------------------------------------------------------------------------

NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?"


def _decimals(number: str) -> int:
    return len(number.split(".")[1]) if "." in number else 0


def parse_figure(text: str) -> tuple[float, float]:
    """(value, half of its last shown digit) of a figure as a view prints it: 368 ms, 1.23 s, 2.7 min, 4m05s,
    2h10m, 5.1k, 2.40 GiB, 512 MiB, 2.0000."""
    text = text.strip().lstrip("▶★ ")
    if m := re.fullmatch(r"(\d+)m(\d\d)s", text):
        return 60 * int(m[1]) + int(m[2]), 0.5
    if m := re.fullmatch(r"(\d+)h(\d\d)m", text):
        return 3600 * int(m[1]) + 60 * int(m[2]), 30.0
    m = re.fullmatch(rf"({NUMBER})\s*(ms|s|min|h|k|M|GiB|MiB)?", text)
    assert m, f"not a figure: {text!r}"
    value, half = float(m[1].replace(",", "")), 0.5 * 10 ** -_decimals(m[1])
    scale = {"ms": 1e-3, "min": 60.0, "h": 3600.0, "k": 1e3, "M": 1e6, "GiB": GIB, "MiB": 2**20}.get(m[2], 1.0)
    return value * scale, half * scale


def parse_delta(text: str) -> float:
    """The change a delta cell leads with: '-0.7%', '~+0.7%', '+60.0% [..]' -> percent."""
    m = re.match(r"~?([-+]\d+(?:\.\d+)?)%", text.strip())
    assert m, f"not a delta: {text!r}"
    return float(m[1])


def check(delta: float, mine: tuple[float, float], theirs: tuple[float, float], where: str) -> None:
    """`delta` (shown to 0.1%) is the change from `theirs` to `mine` within the rounding of all three."""
    (a, ea), (b, eb) = mine, theirs
    low, high = 100 * ((a - ea) / (b + eb) - 1), 100 * ((a + ea) / (b - eb) - 1)
    assert low - 0.05 <= delta <= high + 0.05, f"{where}: {delta:+.1f}% beside {a:g} vs {b:g} ({low:+.2f}..{high:+.2f})"


def _columns(header: list[str], rows: dict[str, list[str]], pairs: dict[str, str], where: str) -> int:
    """Check every (figure column, its delta column) pair of a table; returns how many deltas were checked."""
    checked = 0
    base = rows["baseline"]
    for name, row in rows.items():
        for figure, delta in pairs.items():
            i, j = header.index(figure), header.index(delta)
            if name == "baseline" or not row[j].strip():
                continue
            check(parse_delta(row[j]), parse_figure(row[i]), parse_figure(base[i]), f"{where} {name} {figure}")
            checked += 1
    return checked


# The views ---------------------------------------------------------------------------------------------------

def test_the_run_is_the_case_the_rule_is_for(report) -> None:
    """The raw medians contradict the paired ratios: a rule on raw figures would fail the checks below."""
    trials = {t.name: t for t in report.trials}
    fused, base = trials["fused-adamw"], trials["baseline"]
    assert fused.comparison is not None and fused.comparison.design == "paired"
    assert fused.comparison.ratio == pytest.approx(0.993, abs=0.003)
    assert fused.tokens_per_s.median / base.tokens_per_s.median > 1.12  # raw: +15% or more
    assert fused.deltas["tokens_per_s"].pct == pytest.approx(100 * (1 / fused.comparison.ratio - 1))
    assert trials["dataloader"].deltas["projected_train_time_s"].pct != pytest.approx(
        trials["dataloader"].deltas["step_time_s"].pct, abs=1)  # the warm-up is in the projection only


def test_report_md_deltas_agree_with_their_figures(report) -> None:
    from kronos_tune.benchmark.report.files import report_markdown

    lines = [line for line in report_markdown(report).splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[1:]:
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        rows[cells[0].split(" (")[0]] = [re.split(r" \(raw| \[IQR", cell)[0] for cell in cells]
    assert set(rows) == {t.name for t in report.trials}
    checked = _columns(header, rows, {"time/step [IQR] n": "Δ time [95% CI]", "memory": "Δ mem",
                                      "val loss": "Δ loss"}, "report.md")
    assert checked >= 10


def test_the_cli_table_deltas_agree_with_their_figures(report) -> None:
    from kronos_tune.commands.benchmark import render

    console = Console(record=True, width=260, color_system=None)
    render(console, report)
    lines = console.export_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == ["trial"])
    titles = ["trial", "time/step", "Δ", "projected", "memory", "Δ", "val loss", "Δ"]
    starts, search = [], 0
    for title in titles:  # each column's first character, left to right
        search = lines[at].index(title, search)
        starts.append(search)
        search += len(title)
    names = {t.name for t in report.trials}
    rows = {}
    for line in lines[at + 1:]:
        if line.split()[:1] and line.split()[0] in names:  # a row's first line: each cell's first line
            cells = [line[start:end].strip() for start, end in zip(starts, starts[1:] + [starts[-1] + 12])]
            rows[cells[0]] = [cells[0], cells[1], cells[2], cells[3], cells[4], cells[5], cells[6], cells[7]]
    assert set(rows) == names
    header = ["trial", "time", "Δ time", "projected", "memory", "Δ mem", "val loss", "Δ loss"]
    checked = _columns(header, rows, {"time": "Δ time", "memory": "Δ mem", "val loss": "Δ loss"}, "CLI")
    assert checked >= 10


def test_report_json_deltas_agree_with_the_figures_it_keeps(report, tmp_path) -> None:
    from kronos_tune.benchmark.report.files import write_reports

    write_reports(report, tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    shown = data["shown"]["trials"]
    checked = 0
    for trial in data["trials"]:
        for key, delta in trial["deltas"].items():
            if key == "val_loss":
                mine, theirs = trial["val_loss"], data["trials"][0]["val_loss"]
            else:
                mine, theirs = shown[trial["name"]]["figures"][key], shown["baseline"]["figures"][key]
            assert delta["pct"] == pytest.approx(100 * (mine / theirs - 1), abs=1e-9), (trial["name"], key)
            checked += 1
        if "projected_train_time_s" in trial["deltas"]:  # the projection kept beside it is the one compared
            assert shown[trial["name"]]["figures"]["projected_train_time_s"] == trial["projected_train_time_s"]
    assert checked >= 15
    csv_header = (tmp_path / "report.csv").read_text().splitlines()[0].split(",")
    assert {"step_time_s_shown", "tokens_per_s_shown"} <= set(csv_header)


def test_the_dashboard_deltas_agree_with_their_figures(report) -> None:
    from kronos_tune.benchmark.report.shown import baseline_of
    from kronos_tune.tui.widgets.results import FIGURES, row_cells

    baseline = baseline_of(report.trials)
    labels = [label for _, label, _ in FIGURES["train"]]
    rows = {}
    for trial in report.trials:
        cells = [cell.plain for cell in row_cells(trial, "train", baseline=baseline)][3:3 + len(labels)]
        figures, deltas = [], []
        for cell in cells:  # "368 ms ~-0.7%": the figure, then its delta
            m = re.fullmatch(r"(.+?)(?: (~?[-+]\d+\.\d%))?", cell.strip())
            figures.append(m[1])
            deltas.append(m[2] or "")
        rows[trial.name] = figures + deltas
    header = labels + [f"Δ {label}" for label in labels]
    pairs = {label: f"Δ {label}" for label in labels if label != "MFU"}
    checked = _columns(header, rows, pairs, "dashboard")
    assert checked >= 16  # step time, tokens/s, peak mem, val loss, projected total of four trials


def test_the_pictures_points_are_the_times_shown_and_its_marks_the_tables(report) -> None:
    from kronos_tune.benchmark.report.shown import baseline_of, fastest, shown_figure
    from kronos_tune.benchmark.report.picture import report_scatter
    from kronos_tune.tui.widgets.results import name_cell

    scatter = report_scatter(report)
    baseline = baseline_of(report.trials)
    assert scatter.unit == "sample"  # bigger-batch's batch differs: per training sample
    for trial in report.trials:
        per_sample = shown_figure(trial, "step_time_s", baseline) / (trial.tokens_per_step / 100)
        assert scatter.point(trial.name).seconds == pytest.approx(per_sample, rel=1e-3), trial.name
    assert scatter.recommended == report.recommended.source
    assert scatter.fastest == fastest(report.trials, "train").name != "noise-probe"
    marks = {t.name: name_cell(t.name, scatter.fastest, scatter.recommended).plain.split()[0]
             for t in report.trials if t.name in (scatter.fastest, scatter.recommended)}
    for name, mark in marks.items():
        assert scatter.label(name).startswith(mark)  # the picture writes the marks the table writes


def test_a_bigger_batch_says_its_change_per_step_and_per_token(report) -> None:
    from kronos_tune.benchmark.report.shown import table

    header, rows = table(report)
    row = next(r for r in rows if r[0].text.startswith("bigger-batch"))
    cell = row[header.index("Δ time [95% CI]")].text
    trial = next(t for t in report.trials if t.name == "bigger-batch")
    assert parse_delta(cell) == pytest.approx(100 * (2 * trial.comparison.ratio - 1), abs=0.06)  # twice the work
    assert re.search(r"-10\.\d% per token", cell) or re.search(r"-9\.\d% per token", cell), cell
