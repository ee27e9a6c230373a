"""`from_pretrained` / `save_pretrained` in the published folder format.

A checkpoint is a folder with `config.json` (the constructor keywords) and
`model.safetensors` (the state dict). Loading checks every key and shape and
names the first mismatch.
"""

from __future__ import annotations

import inspect
import json
import os
import warnings
from pathlib import Path
from typing import TypeVar

import torch
import torch.nn as nn

from kronos_core.errors import KronosError
from kronos_core.safetensors_io import load_safetensors, save_safetensors

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

M = TypeVar("M", bound="PretrainedMixin")


class PretrainedMixin:
    """Adds folder-format loading and saving to an nn.Module whose __init__ takes the config keys."""

    def config_dict(self) -> dict:
        names = [name for name in inspect.signature(type(self).__init__).parameters if name != "self"]
        return {name: getattr(self, "_config")[name] for name in names}

    def _remember_config(self, values: dict) -> None:
        self._config = dict(values)

    def save_pretrained(self, directory: str | os.PathLike, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
        """Write config.json + model.safetensors; `state_dict` replaces the module's own (e.g. gathered shards)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config_path = directory / CONFIG_NAME
        temp = config_path.with_name(CONFIG_NAME + ".tmp")
        temp.write_text(json.dumps(self.config_dict(), indent=2) + "\n")
        os.replace(temp, config_path)
        assert isinstance(self, nn.Module)
        state = self.state_dict() if state_dict is None else state_dict
        save_safetensors(state, directory / WEIGHTS_NAME, metadata={"format": "pt"})
        return directory

    @classmethod
    def read_config(cls, directory: str | os.PathLike) -> dict:
        directory = Path(directory)
        if not directory.is_dir():
            raise KronosError(f"checkpoint folder {directory} does not exist; pass a folder holding "
                              f"{CONFIG_NAME} and {WEIGHTS_NAME}")
        config_path = directory / CONFIG_NAME
        if not config_path.is_file():
            raise KronosError(f"{directory} has no {CONFIG_NAME}; a checkpoint folder needs {CONFIG_NAME} "
                              f"and {WEIGHTS_NAME} (as published on the Hub)")
        try:
            config = json.loads(config_path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise KronosError(f"{config_path} is not valid JSON ({error}); restore the original file") from None
        accepted = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
        missing = [name for name in accepted if name not in config and
                   inspect.signature(cls.__init__).parameters[name].default is inspect.Parameter.empty]
        if missing:
            raise KronosError(f"{config_path} lacks {', '.join(missing)} needed by {cls.__name__}; "
                              f"is this a {cls.__name__} checkpoint?")
        unknown = sorted(set(config) - set(accepted))
        if unknown:
            warnings.warn(f"{config_path}: ignoring keys {unknown} unknown to {cls.__name__}", stacklevel=3)
        return {name: config[name] for name in accepted if name in config}

    @classmethod
    def from_pretrained(cls: type[M], directory: str | os.PathLike, device: str | torch.device = "cpu") -> M:
        """Build the module from `config.json` and load `model.safetensors` strictly."""
        directory = Path(directory)
        model = cls(**cls.read_config(directory))
        weights = directory / WEIGHTS_NAME
        if not weights.is_file():
            raise KronosError(f"{directory} has no {WEIGHTS_NAME}; only safetensors checkpoints are loaded "
                              f"(pickled .bin/.pt files are never unpickled)")
        load_checked_state_dict(model, load_safetensors(weights), source=str(weights))
        return model.to(device)


def load_checked_state_dict(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load strictly, naming the first missing, unexpected or mis-shaped key."""
    expected = model.state_dict()
    for key, tensor in expected.items():
        if key not in state:
            raise KronosError(f"{source} lacks weight '{key}' expected by {type(model).__name__}; "
                              f"is it the right model or size?")
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise KronosError(f"{source}: weight '{key}' has shape {tuple(state[key].shape)} but "
                              f"{type(model).__name__} expects {tuple(tensor.shape)}; check config.json")
    for key in state:
        if key not in expected:
            raise KronosError(f"{source} has unexpected weight '{key}'; is config.json from the same model?")
    model.load_state_dict(state, strict=True)
