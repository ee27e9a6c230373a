"""The benchmark's picture: time against peak memory per trial, the Pareto front, the recommendation (▶) and
the fastest trial (★) as the results table marks them, and the memory budget, written as pareto.png and
pareto.svg into the run folder and embedded in report.md (matplotlib, the `plot` extra; without it report.md
and the CLI say in one line how to get the picture)."""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

from kronos_core.optional import install_command
from kronos_tune.figures import have_matplotlib, new_figure, png_key, save_figure
from kronos_tune.benchmark.report import pareto as pareto_module
from kronos_tune.benchmark.report.pareto import (
    FASTEST_MARK, PICTURE_STEM, RECOMMENDED_MARK, Scatter, budget_in_view, front_staircase, memory_scale,
    scatter_of, time_scale,
)
from kronos_tune.benchmark.results import BenchmarkReport

PICTURE_ALT = "step time vs peak memory"
FILES = (f"{PICTURE_STEM}.png", f"{PICTURE_STEM}.svg")


def report_scatter(report: BenchmarkReport) -> Scatter:
    chosen = report.recommended.source if report.recommended is not None else None
    return scatter_of(report.trials, report.task, report.budget_bytes, chosen)


def missing_hint(folder: str | Path | None, markdown: bool = False) -> str:
    """How to get the picture: one line (Markdown: the commands as code and a full stop)."""
    lead, mark, end = ("No picture", "`", ".") if markdown else ("no picture", "", "")
    again = f"kronos-tune report {folder if folder is not None else 'RUN'}"
    return f"{lead}: matplotlib is not installed; {mark}{install_command('plot')}{mark}, then {mark}{again}{mark}{end}"


def picture_key(scatter: Scatter, title: str) -> str:
    """What the picture shows and what draws it: the points, the title, this code and matplotlib's version. The
    same key means the same picture, so `kronos-tune report` on an unchanged run skips matplotlib (about 2 s)."""
    digest = hashlib.blake2b(repr((scatter, title)).encode(), digest_size=16)
    for module in (__file__, pareto_module.__file__):
        digest.update(Path(module).read_bytes())
    try:
        digest.update(metadata.version("matplotlib").encode())
    except metadata.PackageNotFoundError:
        pass
    return digest.hexdigest()


def write_picture(report: BenchmarkReport, folder: Path) -> tuple[list[Path], str]:
    """Draw the picture into `folder`; return the files written (none when the pictures there already show
    this report) and the line report.md shows for it (the embedded picture, or why there is none and how to
    get it)."""
    scatter = report_scatter(report)
    if not scatter.points:
        return [], "No picture: no trial finished with both a time and a peak memory."
    if not have_matplotlib():
        return [], missing_hint(folder, markdown=True)
    title = f"kronos-tune benchmark: {report.subject}, task {report.task}"
    key = picture_key(scatter, title)
    line = f"![{PICTURE_ALT}]({FILES[0]})"
    if png_key(folder / FILES[0]) == key and (folder / FILES[1]).is_file():
        return [], line
    figure = new_figure(figsize=(9, 6), layout="constrained")
    if figure is None:
        return [], missing_hint(folder, markdown=True)
    draw(figure, scatter, title)
    written = [save_figure(figure, folder / name, key=key) for name in FILES]
    return written, line


def picture_line(report: BenchmarkReport) -> str | None:
    """The CLI's one line about the picture: where it is, or how to get it; None when there is nothing to say
    (no run folder, or no trial to draw)."""
    if not report.out_dir:
        return None
    folder = Path(report.out_dir)
    if (folder / FILES[0]).is_file() and have_matplotlib():
        return f"picture (time vs peak memory, Pareto front): {folder / FILES[0]} and {FILES[1]}"
    if not have_matplotlib() and report_scatter(report).points:
        return missing_hint(folder)
    return None


def draw(figure: object, scatter: Scatter, title: str) -> None:
    """One axes on `figure` (a matplotlib Figure): the points, their names, the front, the recommendation,
    the budget; what is not drawn goes into the caption below."""
    axes = figure.add_subplot()  # type: ignore[attr-defined]
    memories = [p.memory_bytes for p in scatter.points]
    show_budget = budget_in_view(scatter)
    mem_div, mem_unit = memory_scale(memories + ([scatter.budget_bytes] if show_budget else []))
    t_mul, t_unit = time_scale(p.seconds for p in scatter.points)

    def xy(points: list) -> tuple[list[float], list[float]]:
        return [p.memory_bytes / mem_div for p in points], [p.seconds * t_mul for p in points]

    configs = [p for p in scatter.points if not p.repeat]
    repeats = [p for p in scatter.points if p.repeat]
    if configs:
        axes.scatter(*xy(configs), s=36, color="tab:blue", zorder=3, label="trial")
    if repeats:
        axes.scatter(*xy(repeats), s=28, facecolors="none", edgecolors="grey", zorder=3,
                     label="baseline measured again (noise)")
    right = 1.12 * max(memories + ([scatter.budget_bytes] if show_budget else [])) / mem_div
    top = 1.12 * max(p.seconds for p in scatter.points) * t_mul
    xs, ys = xy(scatter.points)
    labels = [scatter.label(p.name) for p in scatter.points]  # the marks in the name: never by another
    places = _label_places([(x / right, y / top, label) for x, y, label in zip(xs, ys, labels)])
    for point, label, x, y, place in zip(scatter.points, labels, xs, ys, places):
        moved = place[1] < y / top - LINE / 2  # pushed down past other names: a thin line back to the point
        axes.annotate(label, (x, y), xytext=place, textcoords="axes fraction", fontsize=8, va="bottom",
                      color="dimgrey" if point.repeat else "black",
                      arrowprops={"arrowstyle": "-", "color": "lightgrey", "linewidth": 0.6} if moved else None)
    if scatter.front:
        xs, ys = front_staircase(scatter.front)
        axes.plot([x / mem_div for x in xs], [y * t_mul for y in ys], color="tab:orange", linewidth=1.5,
                  zorder=2, label="Pareto front: no other trial is both faster and smaller")
        axes.scatter(*xy(scatter.front), s=110, facecolors="none", edgecolors="tab:orange", linewidths=1.4,
                     zorder=2)  # rings: a front of one point has no line to show
    chosen = scatter.point(scatter.recommended) if scatter.recommended else None
    if chosen is not None:
        axes.scatter(*xy([chosen]), s=200, marker=">", facecolors="none", edgecolors="tab:green",
                     linewidths=1.6, zorder=4, label=f"{RECOMMENDED_MARK} recommended: {chosen.name}")
    best = scatter.point(scatter.fastest) if scatter.fastest else None
    if best is not None:
        axes.scatter(*xy([best]), s=300, marker="*", facecolors="none", edgecolors="tab:purple",
                     linewidths=1.2, zorder=4, label=f"{FASTEST_MARK} fastest (by the time shown): {best.name}")
    budget = f"memory budget {scatter.budget_bytes / 2**30:.1f} GiB"
    if show_budget:
        axes.axvline(scatter.budget_bytes / mem_div, color="tab:red", linestyle="--", linewidth=1.2, label=budget)
    axes.set_xlim(left=0, right=right)
    axes.set_ylim(bottom=0, top=top)
    axes.set_xlabel(f"peak memory [{mem_unit}]")
    axes.set_ylabel(f"{scatter.axis_label} [{t_unit}]")
    axes.set_title(f"{title}\nlower left is better: faster and smaller", fontsize=10)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="best", fontsize=8)
    caption = [scatter.caption()]
    if scatter.budget_bytes and not show_budget:
        caption.append(f"{budget} ({scatter.budget_bytes / max(memories):.1f}x the largest peak) is off the "
                       f"chart")
    text = "; ".join(c for c in caption if c)
    if text:
        figure.supxlabel(text, fontsize=8, color="dimgrey", wrap=True)  # type: ignore[attr-defined]


LINE = 0.032  # a label's height as a fraction of the axes' height (8 pt text on a 6 inch figure)
CHAR = 0.0075  # a character's width as a fraction of the axes' width


def _label_places(points: list[tuple[float, float, str]]) -> list[tuple[float, float]]:
    """Where each name goes, in axes fractions (points given as axes fractions too): just right of and above
    its point, moved down a line at a time while it would cover a name already placed."""
    placed: list[tuple[float, float, float]] = []  # (left, bottom, right)
    places: dict[int, tuple[float, float]] = {}
    for index in sorted(range(len(points)), key=lambda i: (-points[i][1], points[i][0])):
        x, y, name = points[index]
        left, bottom, right = x + 0.008, y + 0.008, x + 0.008 + CHAR * len(name)
        if right > 0.99:  # past the right edge: the name goes left of its point
            left, right = x - 0.008 - CHAR * len(name), x - 0.008
        while any(left < r and l < right and abs(bottom - b) < LINE for l, b, r in placed):
            bottom -= LINE
        placed.append((left, bottom, right))
        places[index] = (left, bottom)
    return [places[i] for i in range(len(points))]
