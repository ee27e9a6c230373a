"""A benchmark run recorded by an earlier build, rewritten in this build's format, to compare decisions.

    python -m benchmarks.recorded_run ../shared/data/h200/rtx3080-train-results.jsonl /tmp/h200-run
    kronos-tune report /tmp/h200-run

kronos-tune itself refuses a results file of an earlier schema (it would have to guess what the trials
were). The recorded reference runs this project keeps were written before schema 3; this developer tool
gives each trial what the earlier build left implicit, from today's trial list of the run's preset: its
kind, group and promises (by the trial's name; a drift re-measurement is a baseline-repeat), the design
("sequential", the only one then) and config keys under their present names. The measurements are copied
as they are. It writes a new folder (results.jsonl and run.json) and refuses one that exists.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kronos_tune.benchmark.results import SCHEMA_VERSION, TrialKind
from kronos_tune.benchmark.tasks import plan_trials
from kronos_tune.runs import MARK, RUN_FORMAT

# Config keys an earlier build wrote under other names.
PRESENT_NAMES = {"checkpoint_every_n": "activation_checkpointing_every_n", "checkpoint_every": "save_every"}


def kinds_of(preset: str, task: str) -> dict[str, TrialKind]:
    return {spec.name: spec.kind for spec in plan_trials(preset, task) if spec.kind is not None}


def rewrite_trial(trial: dict[str, Any], kinds: dict[str, TrialKind]) -> dict[str, Any]:
    out = dict(trial)
    if trial.get("task", "train") == "train" and "kind" not in trial:
        if trial.get("stage") == "drift":
            kind = TrialKind("baseline-repeat")
        else:
            kind = kinds.get(trial["name"], TrialKind("speed", trial["name"]))
        out.update(kind=kind.kind, group=kind.group, losses=kind.losses, redraws_dropout=kind.redraws_dropout)
    if "design" not in trial and trial.get("stage") in ("single", "combined"):
        out["design"] = "sequential"
    for spread in ("step_time_s", "samples_per_s", "tokens_per_s", "series_per_s"):
        if isinstance(out.get(spread), dict):
            out[spread] = {"q1": None, "q3": None, **out[spread]}
    if isinstance(out.get("config"), dict):
        out["config"] = {PRESENT_NAMES.get(key, key): value for key, value in out["config"].items()}
    out["schema_version"] = SCHEMA_VERSION
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="the recorded results.jsonl (its run.json beside it, "
                                                   "as NAME-run.json or run.json)")
    parser.add_argument("out", type=Path, help="a new folder for the rewritten run")
    args = parser.parse_args(argv)
    if args.out.exists():
        print(f"{args.out}: exists; give a new folder", file=sys.stderr)
        return 2
    lines = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    stem = args.results.name.removesuffix("results.jsonl")
    run_file = next((p for p in (args.results.with_name(f"{stem}run.json"), args.results.with_name("run.json"))
                     if p.is_file()), None)
    run = json.loads(run_file.read_text()) if run_file is not None else {}
    preset, task = run.get("preset") or lines[0].get("preset", "cpu"), run.get("task", lines[0].get("task", "train"))
    kinds = kinds_of(preset, task)
    args.out.mkdir(parents=True)
    (args.out / "results.jsonl").write_text("".join(json.dumps(rewrite_trial(t, kinds)) + "\n" for t in lines))
    identity = {"preset": preset, "task": task}
    extra = {key: value for key, value in run.items() if key not in ("preset", "task")}
    (args.out / "run.json").write_text(json.dumps({"tool": MARK, "format": RUN_FORMAT, "command": "benchmark",
                                                   "identity": identity, "status": "complete", **extra},
                                                  indent=2) + "\n")
    print(f"{len(lines)} trials of {preset} ({task}) rewritten into {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
