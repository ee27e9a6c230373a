"""Rebuild a benchmark report from a run's results.jsonl, on any machine (`kronos-tune report`).

A run folder holds ``results.jsonl`` (one trial per line) and ``run.json``
(preset, task, device, budget, options). A bare results file is accepted too;
its run facts are looked up beside it as ``run.json`` or ``<prefix>-run.json``
(``rtx3080-train-results.jsonl`` -> ``rtx3080-train-run.json``). Nothing here
touches a device: a GPU run is read on a laptop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kronos_tune.errors import KronosTuneError
from kronos_tune.presets import Preset, resolve_preset
from kronos_tune.benchmark.results import RESULTS_FILE, BenchmarkReport, read_results
from kronos_tune.benchmark.report.shown import summarize
from kronos_tune.runs import RUN_FILE, read_run_file

RESULTS_SUFFIX = "-results.jsonl"


@dataclass
class LoadedRun:
    report: BenchmarkReport
    source: Path
    folder: Path | None  # the run folder (None for a bare results file)
    dropped: list[str] = field(default_factory=list)  # lines that were not valid trial results


def _paths(path: Path) -> tuple[Path, Path | None, Path | None]:
    """(results file, run.json or None, run folder or None)."""
    if path.is_dir():
        results = path / RESULTS_FILE
        if not results.is_file():
            raise KronosTuneError(f"report {path}: no {RESULTS_FILE} in that folder; give a benchmark run folder "
                                  f"(kronos-tune benchmark prints it) or a results .jsonl file")
        run = path / RUN_FILE
        return results, run if run.is_file() else None, path
    if not path.is_file():
        raise KronosTuneError(f"report {path}: no such file or folder; give a benchmark run folder or a results "
                              f".jsonl file")
    candidates = [path.with_name(RUN_FILE)]
    if path.name.endswith(RESULTS_SUFFIX):
        candidates.insert(0, path.with_name(path.name[: -len(RESULTS_SUFFIX)] + "-run.json"))
    run = next((c for c in candidates if c.is_file()), None)
    return path, run, None


def _run_facts(run_file: Path | None) -> dict[str, Any]:
    if run_file is None:
        return {}
    data = read_run_file(run_file.parent) if run_file.name == RUN_FILE else None
    if data is None:
        try:
            data = json.loads(run_file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return {}
        if "command" not in data and "preset" in data:
            data = {**data, "identity": {"preset": data.get("preset"), "task": data.get("task"),
                                         "measurement": data.get("measurement")}}
    return data if isinstance(data, dict) else {}


def _recorded_flops(folder: Path | None) -> dict[str, Any] | None:
    """The MFU section of the report.json the run wrote: its FLOPs per token are kept for the same model shape
    (train/summary.py), so rebuilding needs no model and no torch."""
    try:
        data = json.loads((folder / "report.json").read_text(encoding="utf-8")) if folder is not None else {}
    except (OSError, ValueError):
        return None
    flops = data.get("flops") if isinstance(data, dict) else None
    return flops if isinstance(flops, dict) else None


def find_preset(name: str | None, source: str | None) -> Preset | None:
    for candidate in (source, name):
        if not candidate:
            continue
        try:
            return resolve_preset(candidate)
        except Exception:  # noqa: BLE001 - a preset we cannot find only costs the MFU section
            continue
    return None


def load_run(path: str | Path, out_dir: str | Path | None = None) -> LoadedRun:
    """The report of one run, rebuilt from its results (see the module docstring). `out_dir`: where the
    rebuilt files will be written (the recommendation's command points there); default the run folder."""
    results_file, run_file, folder = _paths(Path(path))
    results = read_results(results_file)
    trials, dropped = results.trials, results.dropped
    if not trials:
        extra = f" ({len(dropped)} unreadable line(s))" if dropped else ""
        raise KronosTuneError(f"report {path}: no trial results in {results_file.name}{extra}; the run may not "
                              f"have finished its first trial")
    by_task: dict[str, list[str]] = {}
    for t in trials:
        by_task.setdefault(t.task, []).append(t.name)
    tasks = sorted(by_task)
    if len(tasks) > 1:
        examples = "; ".join(task + ": " + ", ".join(by_task[task][:3]) for task in tasks)
        raise KronosTuneError(f"report {path}: the results mix tasks {', '.join(tasks)} ({examples}); give one "
                              f"run's results")
    facts = _run_facts(run_file)
    identity = facts.get("identity") or {}
    preset_name = identity.get("preset") or facts.get("preset") or "unknown"
    task = tasks[0]
    if identity.get("task") and identity["task"] != task:
        raise KronosTuneError(f"report {path}: run.json says task '{identity['task']}' but the results are "
                              f"'{task}' trials; give the matching results and run.json")
    preset = find_preset(preset_name, facts.get("preset_source"))
    options = dict(facts.get("options") or {})
    measurement = identity.get("measurement") or {}
    for key, value in measurement.items():
        options.setdefault(key, value)
    budget = facts.get("budget_bytes") or options.get("budget_bytes") or (preset.budget_bytes if preset else 0)
    hardware = next((t.hardware for t in trials if t.hardware), "")
    device = facts.get("device") or ("cpu" if not hardware or hardware.endswith("cpu") or " cpu" in hardware
                                     else "cuda")
    device_line = facts.get("device_line") or f"device: {hardware or device} (from the results)"
    planned = list(facts.get("planned") or [t.name for t in trials])
    status = facts.get("status")
    report = BenchmarkReport(
        preset=preset_name, task=task, device=device, device_line=device_line, budget_bytes=int(budget or 0),
        budget_mode=facts.get("budget_mode", "unknown"), trials=trials, planned=planned,
        not_run=[name for name in planned if name not in {t.name for t in trials}],
        cancelled=status == "cancelled", options=options,
        notes=[f"rebuilt by kronos-tune report from {results_file}"] + [f"dropped {d}" for d in dropped],
        preset_source=facts.get("preset_source"),
        out_dir=str(out_dir) if out_dir is not None else str(folder) if folder is not None else None,
        started_at=facts.get("started_at", ""), finished_at=facts.get("finished_at", facts.get("updated_at", "")),
        flops=_recorded_flops(folder), job=facts.get("job"))
    return LoadedRun(summarize(report, preset), results_file, folder, dropped)


def check_comparable(runs: list[LoadedRun]) -> None:
    """Side by side only for one preset and task (two machines, or before/after)."""
    kinds = {(run.report.preset, run.report.task) for run in runs}
    if len(kinds) > 1:
        described = "; ".join(f"{run.source}: preset {run.report.preset}, task {run.report.task}" for run in runs)
        raise KronosTuneError(f"report: the runs mix presets/tasks ({described}); compare runs of one preset and "
                              f"task")
