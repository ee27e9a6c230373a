"""The user's own finetune as the benchmark's workload (`benchmark --config FILE`).

`user_preset` turns a training file (a TOML, flat or with phase tables, or an upstream finetune_csv YAML) into
the preset the runner measures: the hardware is this machine's (`machine_hardware`), or the budget of the
preset `--preset` names; the workload is the file's (data, checkpoints, windows, batch, accumulation, epochs,
lr, amp), kept whole in `Preset.job` for the trials and the recommendation. `save_data` reads the user's files
once, with the same loader training uses, into the run folder: every trial worker opens that copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kronos_core.train.train_file import TrainFile, load_train_file
from kronos_tune.errors import KronosTuneError
from kronos_core.sizes import SIZES
from kronos_tune.presets import BYTES_PER_GIB, BenchmarkBudget, HardwareSpec, Preset, \
    PredictWorkload, TrainWorkload

SAVED_DATA = "data"  # RUN/data/: the user's series as read once, one CSV per series
USER_EVAL_WINDOWS = 64  # the quality guard's cap on the user's validation windows (evaluated by every trial)
CUDA_CONTEXT_GB = 0.5  # held back from a card's free memory for the context and workspaces


def machine_hardware() -> tuple[HardwareSpec, str]:
    """This machine as a preset's hardware: its GPU's free memory, else the RAM free now; and the line that
    says so."""
    import psutil
    import torch

    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        name = torch.cuda.get_device_name()
        spec = HardwareSpec("cuda", 1, free / BYTES_PER_GIB, torch.cuda.is_bf16_supported(), CUDA_CONTEXT_GB)
        return spec, (f"hardware: this machine's {name}, {free / BYTES_PER_GIB:.1f} of {total / BYTES_PER_GIB:.1f} "
                      f"GiB free (--preset NAME simulates another budget)")
    free = psutil.virtual_memory().available
    spec = HardwareSpec("cpu", 1, free / BYTES_PER_GIB, False, 0.0)
    return spec, (f"hardware: this machine's CPU, {free / BYTES_PER_GIB:.1f} GiB of RAM free now (--preset NAME "
                  f"simulates another budget)")


def benchmarked_phase(job: TrainFile, phase: str | None) -> str:
    """The phase the benchmark times: --phase, else the predictor where the file trains it."""
    trains = list(job.phases) or [job.what]
    if phase is not None:
        if phase not in trains:
            raise KronosTuneError(f"--phase {phase}: {job.path} trains {' and '.join(trains)}; give --phase "
                                  f"{' or '.join(trains)}")
        return phase
    return "predictor" if "predictor" in trains else trains[0]


def user_preset(path: Path, phase: str | None, hardware_preset: Preset | None) -> tuple[Preset, list[str]]:
    """The preset for `benchmark --config PATH` and the lines the plan prints (hardware, the data's windows,
    the checks of the job). A missing data path is one line here, before any folder is claimed."""
    from kronos_core.data.file_dates import check_file_dates
    from kronos_core.data.kline import find_data_files
    from kronos_core.train.windows import count_windows
    from kronos_tune.train.checks import job_checks

    job = load_train_file(path)
    job.shared.update(located(job.shared))
    chosen = benchmarked_phase(job, phase)
    config = job.config(chosen if job.phases else None)
    if config.is_synthetic:
        raise KronosTuneError(f"--config {path}: its data is synthetic; a benchmark of synthetic data is what "
                              f"--preset runs (kronos-tune presets); give data = [\"your.csv\"] in the file")
    check_file_dates(find_data_files(config.data), config.date_format)
    counted = count_windows(config)
    if hardware_preset is None:
        hardware, line = machine_hardware()
        budget, name, source = BenchmarkBudget(), path.stem, None
    else:
        hardware, budget = hardware_preset.hardware, hardware_preset.benchmark
        name, source = f"{path.stem}-on-{hardware_preset.name}", hardware_preset.source_path
        line = (f"hardware: preset {hardware_preset.name}'s budget ({hardware.memory_per_device_gb:g} GiB "
                f"{hardware.device}), simulated on this machine; the workload is {path}'s, not the preset's")
    workload = TrainWorkload(config.model_size, SIZES[config.model_size].tokenizer,
                             config.lookback_window, config.predict_window, config.batch_size,
                             config.accumulation_steps, config.epochs, config.samples_per_epoch,
                             min(counted.val, config.eval_samples, USER_EVAL_WINDOWS), config.amp)
    predict = hardware_preset.predict if hardware_preset is not None else PredictWorkload(100, 400, 30, 1)
    record = {"source": str(path), "phase": chosen, "values": job.values(chosen if job.phases else None),
              "shared": job.shared, "phases": job.phases, "upstream": job.upstream, "sources": job.sources,
              "notes": job.notes, "data": list(config.data),
              "windows": {"train": counted.train, "val": counted.val, "rows": counted.window_length,
                          "evaluated": min(counted.val, config.eval_samples, USER_EVAL_WINDOWS)}}
    preset = Preset(name, f"the finetune of {path}", hardware, workload, predict, source, budget, job=record)
    phase_line = (f"workload: {path}, the {chosen} phase" + (f" of {' then '.join(job.phases)} (--phase to "
                                                               f"choose)" if job.two_phases else ""))
    lines = [line, phase_line, *job.notes, *job_checks(config, job.upstream, counted)]
    return preset, lines


def located(values: dict[str, Any]) -> dict[str, Any]:
    """The data files and local checkpoint folders as absolute paths: report.json names the files measured, and
    the recommended config, written into the run folder, still finds them (hub ids stay as they are)."""
    found: dict[str, Any] = {}
    if "data" in values:
        found["data"] = [item if item == "synthetic" else str(Path(item).expanduser().absolute())
                         for item in values["data"]]
    for key in ("predictor_dir", "tokenizer_dir"):
        if values.get(key) and Path(values[key]).expanduser().exists():
            found[key] = str(Path(values[key]).expanduser().absolute())
    return found


def train_values(preset: Preset) -> dict[str, Any]:
    """The user's phase as TrainConfig keys (what the baseline starts from)."""
    assert preset.job is not None
    return dict(preset.job["values"], what=preset.job["phase"])


def save_data(preset: Preset, folder: Path) -> Path:
    """Read the user's data once (dates parsed, train_until applied) and write one CSV per series into
    `folder`/data; the trials read this copy, so their windows are the user's."""
    from kronos_core.train.config import TrainConfig
    from kronos_core.train.loading import load_training_data

    config = TrainConfig.from_dict(train_values(preset), source=str(preset.job["source"]))  # type: ignore[index]
    frames, _ = load_training_data(config)
    target = folder / SAVED_DATA
    target.mkdir(parents=True, exist_ok=True)
    for index, frame in enumerate(frames):
        frame.to_csv(target / f"series-{index:04d}.csv", index=False)
    return target


def as_saved(values: dict[str, Any], saved: Path) -> dict[str, Any]:
    """A trial's config keys reading the saved copy: no panel column, date format or cut left to apply."""
    return {**values, "data": [str(saved)], "symbol_column": None, "date_format": None, "train_until": None}


__all__ = ["SAVED_DATA", "USER_EVAL_WINDOWS", "as_saved", "benchmarked_phase", "located", "machine_hardware", "save_data",
           "train_values", "user_preset"]
