"""`kronos-tune report DIR [DIR ...]`: rebuild a benchmark's reports and recommendation from its results.

One run: the table, the timing and quality sections and the recommendation, as the benchmark printed them,
recomputed with the current decision rule (report.json/.csv/.md and recommended.toml written into the run folder,
or into --out). Two or more runs of one preset and task: one side-by-side table.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from kronos_tune.commands.common import make_console
from kronos_tune.commands.benchmark import render
from kronos_tune.errors import KronosTuneError
from kronos_tune.benchmark.report.rebuild import LoadedRun, check_comparable, load_run
from kronos_tune.benchmark.report.files import REPORT_FILES, write_reports
from kronos_tune.benchmark.report.cells import fmt_seconds
from kronos_tune.benchmark.tasks import get


def _writable(folder: Path) -> bool:
    return folder.is_dir() and os.access(folder, os.W_OK)


def side_by_side(runs: list[LoadedRun]) -> Table:
    """Median step time [IQR], Δ vs each run's own baseline and the verdict, one column pair per run."""
    table = Table(title=f"kronos-tune report: preset {runs[0].report.preset}, task {runs[0].report.task}",
                  title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
    table.add_column("trial")
    for index, run in enumerate(runs, start=1):
        table.add_column(f"[{index}] time/step", no_wrap=True)
        table.add_column(f"[{index}] Δ vs its baseline", no_wrap=True)
    names: list[str] = []
    for run in runs:
        names += [t.name for t in run.report.trials if t.name not in names]
    for name in names:
        cells = [name]
        for run in runs:
            trial = run.report.trial(name)
            if trial is None or trial.step_time_s is None:
                cells += ["–" if trial is None else trial.status, ""]
                continue
            spread = trial.step_time_s
            cells.append(f"{fmt_seconds(spread.median)} n={spread.n}")
            comparison = trial.comparison
            if comparison is not None:
                cells.append(f"{comparison.pct:+.1f}% {comparison.verdict}")
            else:
                cells.append("reference" if name == "baseline" else "")
        table.add_row(*(escape(c) for c in cells))
    return table


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        runs: Annotated[list[Path], typer.Argument(metavar="RUN...", help="Benchmark run folders (or results .jsonl files).")],
        out: Annotated[Optional[Path], typer.Option("--out", metavar="DIR", help="Write the rebuilt report files here (one run).", file_okay=False)] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print the rebuilt report.json (one run) or a list of them.")] = False,
    ) -> None:
        """Rebuild report.md/json/csv and the recommendation from a run's results.jsonl, on any machine; with
        two or more runs of one preset and task, one side-by-side table."""
        target = None
        if len(runs) == 1:
            target = out if out is not None else (runs[0] if _writable(runs[0]) else None)
        loaded = [load_run(path, out_dir=target) for path in runs]
        console = make_console(stderr=json_out)
        for run in loaded:
            for dropped in run.dropped:
                console.print(f"[yellow]warning[/]: dropped {escape(dropped)} (kept the valid lines)",
                              highlight=False, soft_wrap=True)
        if len(loaded) > 1:
            if out is not None:
                raise KronosTuneError("report --out: give one run to write its files; several runs are compared "
                                      "on screen only")
            check_comparable(loaded)
            if json_out:
                typer.echo(json.dumps([run.report.to_dict() for run in loaded], indent=2))
                return
            console.print(side_by_side(loaded))
            for index, run in enumerate(loaded, start=1):
                rec = run.report.recommended
                source, reason = (rec.source, rec.reason) if rec is not None else (None, None)
                console.print(f"[{index}] {escape(str(run.source))}: {escape(run.report.device_line)}; "
                              f"recommended [bold]{escape(str(source))}[/]: {escape(str(reason))}",
                              highlight=False, soft_wrap=True)
            return
        run = loaded[0]
        if target is None and run.report.recommended is not None:  # nothing written here: say how to get it
            verb = get(run.report.task).config_command
            run.report.recommended = run.report.recommended.with_command(
                f"kronos-tune report {runs[0]} --out DIR, then kronos-tune {verb} --config DIR/recommended.toml")
        if target is not None:
            try:
                write_reports(run.report, target, results=out is not None)
            except OSError as error:
                raise KronosTuneError(f"report --out {target}: cannot write there ({error.strerror or error}); "
                                      f"pick a folder you can write to") from None
        if json_out:
            typer.echo(json.dumps(run.report.to_dict(), indent=2))
        else:
            render(console, run.report)
            if target is None:
                console.print(f"[dim]- not written ({', '.join(REPORT_FILES)}): give --out DIR to write them[/]",
                              highlight=False, soft_wrap=True)
