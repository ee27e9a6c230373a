"""The user's own finetune as the benchmark's workload (`benchmark --config FILE`).

`user_preset` turns a training file (a TOML, flat or with phase tables, or an upstream finetune_csv YAML) into
the preset the runner measures: the hardware is this machine's (`machine_hardware`), or the budget of the
preset `--preset` names; the workload is the file's (data, checkpoints, windows, batch, accumulation, epochs,
lr, amp), kept whole in `Preset.job` for the trials and the recommendation. `save_data` reads the user's files
once, with the same loader training uses, into the run folder: every trial worker opens that copy. A predict
job (`user_predict_preset`) is saved once too (`save_predict_series`, predict's loader, as arrays).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from kronos_core.train.train_file import TrainFile, load_train_file
from kronos_tune.errors import KronosTuneError
from kronos_core.sizes import SIZES
from kronos_tune.presets import BYTES_PER_GIB, BenchmarkBudget, HardwareSpec, Preset, \
    PredictWorkload, TrainWorkload

SAVED_DATA = "data"  # RUN/data/: the user's series as read once, one CSV per series
SAVED_SERIES = "series.npz"  # RUN/data/series.npz: a predict job's series as read once, as arrays
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


def _where(path: Path, hardware_preset: Preset | None) -> tuple[HardwareSpec, BenchmarkBudget, str, Path | None, str]:
    """The hardware, benchmark budget, preset name and source a user's job is measured with, and the line that
    says so: this machine's, or the budget of `hardware_preset` simulated here."""
    if hardware_preset is None:
        hardware, line = machine_hardware()
        return hardware, BenchmarkBudget(), path.stem, None, line
    hardware = hardware_preset.hardware
    return (hardware, hardware_preset.benchmark, f"{path.stem}-on-{hardware_preset.name}", hardware_preset.source_path,
            f"hardware: preset {hardware_preset.name}'s budget ({hardware.memory_per_device_gb:g} GiB "
            f"{hardware.device}), simulated on this machine; the workload is {path}'s, not the preset's")


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
    from kronos_core.data.tables import check_file_dates
    from kronos_core.data.kline import find_data_files
    from kronos_core.train.loading import count_windows
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
    hardware, budget, name, source, line = _where(path, hardware_preset)
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


# The [predict] keys that say what is predicted and with which model: a predict trial keeps them as they are.
PREDICT_INPUT_KEYS = ("data", "checkpoint", "tokenizer", "offline", "date_format", "symbol_column",
                      "holdout", "calendar")


def user_predict_preset(path: Path, hardware_preset: Preset | None) -> tuple[Preset, list[str]]:
    """The preset for `benchmark --task predict --config PATH` (a [predict] file) and its plan lines: the user's
    series (counted here; the run saves them once for the trials: save_predict_series), model, windows and sample
    paths."""
    from kronos_core.train.upstream import size_of
    from kronos_tune.predict.config import PredictConfig, check_data_paths
    from kronos_tune.predict.config_file import read_predict_file
    from kronos_tune.predict.inputs import load_inputs

    values = read_predict_file(path)
    if not values.get("data"):
        raise KronosTuneError(f"--config {path}: no data in its [predict] table; a benchmark of synthetic series is "
                              f"what --preset runs; give data = [\"your.csv\"]")
    for key in ("lookback", "pred_len"):
        if values.get(key) is None:
            raise KronosTuneError(f"--config {path}: [predict] has no {key}; give {key} = N (the job's window)")
    if (values.get("size") is None) == (values.get("checkpoint") is None):
        raise KronosTuneError(f"--config {path}: give exactly one of size = NAME or checkpoint = DIR (with "
                              f"tokenizer = DIR) in [predict]")
    inputs = {key: values[key] for key in PREDICT_INPUT_KEYS if values.get(key) is not None}
    inputs["data"] = [str(Path(item).expanduser().absolute()) for item in values["data"]]
    for key in ("checkpoint", "tokenizer"):
        if key in inputs:
            local = Path(inputs[key]).expanduser()
            inputs[key] = str(local.absolute()) if local.exists() else str(inputs[key])
    config = PredictConfig(lookback=values["lookback"], pred_len=values["pred_len"], size=values.get("size"),
                           **{key: tuple(map(Path, value)) if key == "data" else Path(value)
                              if key in ("checkpoint", "tokenizer") else value for key, value in inputs.items()})
    check_data_paths(config)
    notes: list[str] = []
    series = len(load_inputs(config, lambda level, message: notes.append(message)))
    size = values.get("size") or size_of(inputs.get("checkpoint"), inputs.get("tokenizer"))
    sample_count = int(values.get("sample_count") or 1)
    hardware, budget, name, source, line = _where(path, hardware_preset)
    train = hardware_preset.workload if hardware_preset is not None else TrainWorkload(
        size, SIZES[size].tokenizer, values["lookback"], values["pred_len"], 1, 1, 1, 1, 1, "none")
    train = replace(train, model_size=size, tokenizer=SIZES[size].tokenizer)
    workload = PredictWorkload(series, values["lookback"], values["pred_len"], sample_count)
    stringified = {key: [str(item) for item in value] if key == "data" else str(value) if isinstance(value, Path)
                   else value for key, value in values.items()}
    record = {"task": "predict", "source": str(path), "data": inputs["data"], "series": series,
              "inputs": inputs, "values": {**stringified, **inputs}}
    preset = Preset(name, f"the prediction job of {path}", hardware, train, workload, source, budget, job=record)
    model = inputs.get("checkpoint") or f"random Kronos-{size}"
    lines = [line, f"workload: {path}: {series:,} series of {', '.join(inputs['data'])}, lookback {values['lookback']}"
                   f", pred_len {values['pred_len']}, {sample_count} sample path(s), {model}", *notes]
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


def save_predict_series(settings: Any, device: str, folder: Path) -> Path:
    """`benchmark --task predict --config FILE`: read the user's series once, as `kronos-tune predict` reads them,
    into `folder`/data/series.npz (`predict.series.save_series`); every trial worker and rank opens that copy
    (`settings`: a trial's PredictSettings with the user's `inputs`)."""
    from kronos_tune.benchmark.predict.pipeline import predict_config
    from kronos_tune.predict.inputs import load_inputs
    from kronos_tune.predict.series import save_series

    target = folder / SAVED_DATA / SAVED_SERIES
    target.parent.mkdir(parents=True, exist_ok=True)
    save_series(target, load_inputs(predict_config(settings, device), lambda level, message: None))
    return target


def as_saved(values: dict[str, Any], saved: Path) -> dict[str, Any]:
    """A trial's config keys reading the saved copy: no panel column, date format or cut left to apply."""
    return {**values, "data": [str(saved)], "symbol_column": None, "date_format": None, "train_until": None}


__all__ = ["PREDICT_INPUT_KEYS", "SAVED_DATA", "SAVED_SERIES", "USER_EVAL_WINDOWS", "as_saved", "benchmarked_phase",
           "located", "machine_hardware", "save_data", "save_predict_series", "train_values", "user_predict_preset",
           "user_preset"]
