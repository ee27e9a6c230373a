"""An upstream Kronos finetune_csv YAML config, read as this project's training keys.

Upstream (shiyu-coder/Kronos, finetune_csv/) keeps its settings in six sections: data, training, model_paths,
experiment, device, distributed. `read_upstream(path)` maps every key it knows to TrainConfig keys: the keys
both phases share, and per phase (tokenizer, predictor) the epochs and learning rate; keys that have no
equivalent here are named in one note. A section upstream does not have is an error: such a file is not an
upstream finetune config. docs/train.md has the table of every key.

Upstream's epoch is one pass over the training windows, so the epoch's size depends on the data: the caller
(kronos_core.train.train_file) counts the windows and sets samples_per_epoch and eval_samples from them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kronos_core.errors import KronosError

SECTIONS = ("data", "training", "model_paths", "experiment", "device", "distributed")
PHASES = ("tokenizer", "predictor")

# Upstream keys with no equivalent here, and why (the note names them; docs/train.md repeats the why).
NO_EQUIVALENT = {
    "data.max_context": "the context is the model size's",
    "training.log_interval": "every step is logged to metrics.jsonl",
    "model_paths.base_path": "each run gets its own folder under runs/train/",
    "model_paths.base_save_path": "each run gets its own folder under runs/train/",
    "model_paths.tokenizer_save_name": "the phases write RUN/tokenizer and RUN/predictor",
    "model_paths.basemodel_save_name": "the phases write RUN/tokenizer and RUN/predictor",
    "experiment.description": "no field for it",
    "experiment.use_comet": "no Comet logging (TensorBoard with --tensorboard)",
    "experiment.skip_existing": "a finished phase is never trained again by --resume",
    "device.device_id": "choose the card with CUDA_VISIBLE_DEVICES",
    "distributed.use_ddp": "give --nproc N (torchrun) instead",
    "distributed.backend": "nccl on CUDA, gloo on the CPU, chosen by the device",
}
# Keys upstream reads that this module maps (with NO_EQUIVALENT: every key upstream's config loader reads).
MAPPED = {
    "data": ("data_path", "lookback_window", "predict_window", "clip", "train_ratio", "val_ratio", "test_ratio"),
    "training": ("epochs", "tokenizer_epochs", "basemodel_epochs", "batch_size", "num_workers", "seed",
                 "tokenizer_learning_rate", "predictor_learning_rate", "adam_beta1", "adam_beta2",
                 "adam_weight_decay", "accumulation_steps"),
    "model_paths": ("exp_name", "pretrained_tokenizer", "pretrained_predictor", "finetuned_tokenizer"),
    "experiment": ("name", "train_tokenizer", "train_basemodel", "pre_trained", "pre_trained_tokenizer",
                   "pre_trained_predictor"),
    "device": ("use_cuda",),
    "distributed": (),
}
DEFAULT_EPOCHS = 30  # upstream's, for a phase whose epochs the file leaves out
DEFAULT_SIZE = "small"  # a checkpoint whose name does not say its size
_SIZE_IN_NAME = re.compile(r"kronos-(tiny|mini|small|base|large)\b", re.IGNORECASE)
_TOKENIZER_SIZE = {"2k": "mini", "base": "small"}


@dataclass
class UpstreamConfig:
    """The file as TrainConfig keys: `shared` by every phase, `phases` in training order with their own keys,
    `sources` (TrainConfig key -> the upstream keys it came from), the run label and the one-line note of
    keys not used."""

    shared: dict[str, Any]
    phases: dict[str, dict[str, Any]]
    sources: dict[str, str] = field(default_factory=dict)
    label: str | None = None
    unused: list[str] = field(default_factory=list)

    def note(self) -> str | None:
        if not self.unused:
            return None
        return "upstream keys with no equivalent here, not used: " + ", ".join(self.unused) + \
            " (docs/train.md says why for each)"


def read_upstream(path: str | Path) -> UpstreamConfig:
    """Parse and map an upstream finetune_csv YAML; one KronosError line for what is not one."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise KronosError(f"{path}: training config not found; check the path")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        raise KronosError(f"{path}: malformed YAML{at}; fix the syntax there") from None
    if not isinstance(raw, dict) or not raw:
        raise KronosError(f"{path}: not an upstream Kronos finetune config (expected the sections "
                          f"{', '.join(SECTIONS)}); give a kronos-tune TOML or an upstream finetune_csv YAML")
    for section, body in raw.items():
        if section not in SECTIONS:
            raise KronosError(f"{path}: section '{section}' is not one of an upstream Kronos finetune config "
                              f"({', '.join(SECTIONS)}); this is not a finetune_csv config, give one or a "
                              f"kronos-tune TOML")
        if body is not None and not isinstance(body, dict):
            raise KronosError(f"{path}: section '{section}' must hold key: value lines, not {body!r}")
    return _Mapping(path, {name: dict(body or {}) for name, body in raw.items()}).result()


class _Mapping:
    def __init__(self, path: Path, sections: dict[str, dict[str, Any]]) -> None:
        self.path, self.sections = path, sections
        self.out = UpstreamConfig({}, {})
        for section, body in sections.items():
            for key in body:
                dotted = f"{section}.{key}"
                if dotted in NO_EQUIVALENT or key not in MAPPED[section]:
                    self.out.unused.append(dotted)

    def get(self, section: str, key: str, default: Any = None) -> Any:
        value = self.sections.get(section, {}).get(key)
        return default if value is None else value

    def has(self, section: str, key: str) -> bool:
        return self.sections.get(section, {}).get(key) is not None

    def put(self, key: str, value: Any, *sources: str) -> None:
        self.out.shared[key] = value
        self.out.sources[key] = ", ".join(sources)

    def copy(self, section: str, key: str, target: str | None = None) -> None:
        if self.has(section, key):
            self.put(target or key, self.get(section, key), f"{section}.{key}")

    def result(self) -> UpstreamConfig:
        data_path = self.get("data", "data_path")
        if not data_path:
            raise KronosError(f"{self.path}: data.data_path is missing; set it to the CSV file of your K-lines")
        self.put("data", [str(data_path)], "data.data_path")
        for key in ("lookback_window", "predict_window", "clip"):
            self.copy("data", key)
        self._split()
        for key in ("batch_size", "num_workers", "seed", "accumulation_steps"):
            self.copy("training", key)
        if self.has("training", "adam_beta1") or self.has("training", "adam_beta2"):
            self.put("betas", [float(self.get("training", "adam_beta1", 0.9)),
                               float(self.get("training", "adam_beta2", 0.95))],
                     "training.adam_beta1", "training.adam_beta2")
        self.copy("training", "adam_weight_decay", "weight_decay")
        if self.has("device", "use_cuda"):
            self.put("device", "auto" if self.get("device", "use_cuda") else "cpu", "device.use_cuda")
        self._weights()
        self._phases()
        self.out.label = self.get("model_paths", "exp_name") or self.get("experiment", "name")
        return self.out

    def _split(self) -> None:
        """Upstream cuts the timeline in train / val / test parts in that order; the test part is never
        trained on, so the training data stops before it (train_until) and the validation share is of the rest."""
        train = float(self.get("data", "train_ratio", 0.9))
        val = float(self.get("data", "val_ratio", 0.1))
        test = float(self.get("data", "test_ratio", 0.0))
        if not (train > 0 and val > 0 and test >= 0):
            raise KronosError(f"{self.path}: data.train_ratio {train:g}, val_ratio {val:g} and test_ratio {test:g} "
                              f"must be positive (test_ratio may be 0)")
        total = train + val + test
        sources = ("data.train_ratio", "data.val_ratio", "data.test_ratio")
        self.put("val_fraction", round(val / (train + val), 6), *sources)
        if test > 0:
            self.put("train_until", f"{(train + val) / total:.6g}", *sources)

    def _weights(self) -> None:
        """The checkpoints to start from: a phase upstream starts from random weights (pre_trained false)
        or with an empty path has none."""
        both = self.get("experiment", "pre_trained")
        use_tokenizer = bool(self.get("experiment", "pre_trained_tokenizer", True if both is None else both))
        use_predictor = bool(self.get("experiment", "pre_trained_predictor", True if both is None else both))
        tokenizer = self.get("model_paths", "pretrained_tokenizer") if use_tokenizer else None
        predictor = self.get("model_paths", "pretrained_predictor") if use_predictor else None
        trains_tokenizer = bool(self.get("experiment", "train_tokenizer", True))
        finetuned = self.get("model_paths", "finetuned_tokenizer")
        if not trains_tokenizer and finetuned:  # upstream's predictor phase then loads this tokenizer
            tokenizer = finetuned
        if tokenizer:
            self.put("tokenizer_dir", str(tokenizer), "model_paths.pretrained_tokenizer", "experiment.pre_trained*")
        if predictor:
            self.put("predictor_dir", str(predictor), "model_paths.pretrained_predictor", "experiment.pre_trained*")
        self.put("model_size", size_of(predictor, tokenizer), "the name of model_paths.pretrained_predictor (small when it names no size)")

    def _phases(self) -> None:
        common = self.get("training", "epochs")
        wanted = {"tokenizer": bool(self.get("experiment", "train_tokenizer", True)),
                  "predictor": bool(self.get("experiment", "train_basemodel", True))}
        if not any(wanted.values()):
            raise KronosError(f"{self.path}: experiment.train_tokenizer and train_basemodel are both false: "
                              f"nothing to train; set one of them to true")
        epochs_key = {"tokenizer": "tokenizer_epochs", "predictor": "basemodel_epochs"}
        lr_key = {"tokenizer": "tokenizer_learning_rate", "predictor": "predictor_learning_rate"}
        for phase in PHASES:
            if not wanted[phase]:
                continue
            keys: dict[str, Any] = {"epochs": int(self.get("training", epochs_key[phase], common or DEFAULT_EPOCHS))}
            if self.has("training", lr_key[phase]):
                keys["lr"] = float(self.get("training", lr_key[phase]))
            self.out.phases[phase] = keys
        self.out.sources["epochs"] = "training.tokenizer_epochs / basemodel_epochs (or training.epochs)"
        self.out.sources["lr"] = "training.tokenizer_learning_rate / predictor_learning_rate"


def size_of(predictor: Any, tokenizer: Any) -> str:
    """The model size a checkpoint's name says (NeoQuasar/Kronos-small), else the tokenizer's, else small."""
    found = _SIZE_IN_NAME.search(str(predictor or ""))
    if found:
        return found.group(1).lower()
    named = re.search(r"tokenizer-(2k|base)\b", str(tokenizer or ""), re.IGNORECASE)
    return _TOKENIZER_SIZE[named.group(1).lower()] if named else DEFAULT_SIZE


__all__ = ["NO_EQUIVALENT", "PHASES", "SECTIONS", "UpstreamConfig", "read_upstream", "size_of"]
