"""The benchmark's tasks by name: "train" and "predict"."""

from __future__ import annotations

from kronos_tune.benchmark.options import ProtocolOptions
from kronos_tune.benchmark.predict.trial_list import PREDICT_TRIALS, check_predict_options, plan_predict
from kronos_tune.benchmark.results import TrialSpec
from kronos_tune.benchmark.selection import check_names, resolve
from kronos_tune.benchmark.train.trial_list import TRAIN_TRIALS, plan_train
from kronos_tune.presets import Preset
from kronos_tune.workloads import runnable_device


def plan_trials(preset: Preset | str, task: str = "train",
                options: ProtocolOptions = ProtocolOptions()) -> list[TrialSpec]:
    """Every trial of the protocol in run order (baseline first, combined last), skipped ones with their reason."""
    preset = resolve(preset)
    if task == "predict":
        check_names(task, options, PREDICT_TRIALS)
        check_predict_options(options)
        device, _ = runnable_device(preset)
        return plan_predict(preset, options, device)
    check_names(task, options, TRAIN_TRIALS)
    device, _ = runnable_device(preset)
    return plan_train(preset, options, device)
