"""`from_pretrained` / `save_pretrained` in the published folder format.

`from_pretrained` takes a folder or a Hugging Face hub id (`NeoQuasar/Kronos-small`,
`...@revision`; resolved by `kronos_core.hub`: the local cache first, a download when
online). A pretrained folder holds `config.json` (the constructor keywords) and
`model.safetensors` (the state dict). Loading builds the module with its weight
matrices on the meta device (no storage, no random init), checks every key and
shape against the file's header and names the first mismatch, then assigns the
memory-mapped tensors as the module's parameters and buffers: no weight is
initialized, read in full or copied, and on the CPU a weight's pages are read
from the file when first used.
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
from torch.overrides import TorchFunctionMode

from kronos_core.errors import KronosError
from kronos_core.files import write_text_atomic
from kronos_core.hub import CONFIG_NAME, WEIGHTS_NAME, resolve_pretrained
from kronos_core.safetensors_io import load_safetensors, save_safetensors

M = TypeVar("M", bound="PretrainedMixin")


class _WeightsOnMeta(TorchFunctionMode):
    """While a module is built: `torch.empty` makes meta tensors and torch.nn.init skips them.

    Weight matrices are allocated with `torch.empty` and then initialized, so this
    builds them with no storage and no random init. Everything else (small buffers
    such as rotary frequencies, norm weights) is computed on the CPU as usual:
    much arithmetic on the meta device runs through torch's Python decompositions,
    whose first use imports torch._dynamo and sympy (seconds, ~75 MiB resident).
    """

    _RANDOM_FILLS = {torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.random_, torch.Tensor.bernoulli_,
                     torch.Tensor.exponential_, torch.Tensor.log_normal_, torch.Tensor.cauchy_,
                     torch.Tensor.geometric_}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.empty and kwargs.get("device") is None:
            kwargs["device"] = "meta"
        elif func in self._RANDOM_FILLS or getattr(func, "__module__", None) == "torch.nn.init":
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


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
        write_text_atomic(directory / CONFIG_NAME, json.dumps(self.config_dict(), indent=2) + "\n")
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
    def from_pretrained(cls: type[M], directory: str | os.PathLike, device: str | torch.device = "cpu",
                        dtype: torch.dtype | None = None, *, revision: str | None = None,
                        local_files_only: bool | None = None) -> M:
        """Build the module from `config.json` and load `model.safetensors` strictly onto `device`.

        `directory`: a folder, or a hub id such as "NeoQuasar/Kronos-small" (optionally "...@revision", or
        `revision=`); `local_files_only=True` never downloads (default: HF_HUB_OFFLINE decides).
        Floating-point weights become `dtype` (default: the module's own, float32); integer buffers keep theirs.
        """
        if revision is not None:
            if "@" in os.fspath(directory):
                raise KronosError(f"{os.fspath(directory)}: give the revision once, as @revision or revision=")
            directory = f"{os.fspath(directory)}@{revision}"
        directory = resolve_pretrained(directory, offline=local_files_only).path
        config = cls.read_config(directory)
        weights = directory / WEIGHTS_NAME
        if not weights.is_file():
            raise KronosError(f"{directory} has no {WEIGHTS_NAME}; only safetensors checkpoints are loaded "
                              f"(pickled .bin/.pt files are never unpickled)")
        with _WeightsOnMeta():
            model = cls(**config)
        assert isinstance(model, nn.Module)
        load_pretrained_weights(model, weights, device, dtype)
        return model


def _check_keys_and_shapes(model: nn.Module, expected: dict[str, torch.Tensor], found: dict[str, tuple[int, ...]],
                           source: str) -> None:
    """Name the first missing, mis-shaped or unexpected weight."""
    for key, tensor in expected.items():
        if key not in found:
            raise KronosError(f"{source} lacks weight '{key}' expected by {type(model).__name__}; "
                              f"is it the right model or size?")
        if found[key] != tuple(tensor.shape):
            raise KronosError(f"{source}: weight '{key}' has shape {found[key]} but "
                              f"{type(model).__name__} expects {tuple(tensor.shape)}; check config.json")
    for key in found:
        if key not in expected:
            raise KronosError(f"{source} has unexpected weight '{key}'; is config.json from the same model?")


def load_pretrained_weights(model: nn.Module, weights: Path, device: str | torch.device = "cpu",
                            dtype: torch.dtype | None = None) -> None:
    """Assign the tensors of `weights` to `model` (built under `_WeightsOnMeta`, or anywhere) after checking them.

    A tensor the file does not hold is moved to `device`; one left on the meta device has no values, so
    that is refused here rather than failing later in a forward pass.
    """
    expected = model.state_dict()
    targets = {key: dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
               for key, tensor in expected.items()}
    state = load_safetensors(weights, device=device, dtype=targets,
                             check=lambda found: _check_keys_and_shapes(model, expected, found, str(weights)))
    model.load_state_dict(state, strict=True, assign=True)
    # Strict loading replaced every parameter and persistent buffer; non-persistent ones were built on the CPU.
    for owner in model.modules():
        for name, buffer in owner.named_buffers(recurse=False):
            if buffer.is_meta:
                raise RuntimeError(f"{type(owner).__name__}.{name} is not in the state dict, so loading left it "
                                   f"without values; compute it on the CPU in __init__ or make it persistent")
            if buffer.device != torch.device(device):
                setattr(owner, name, buffer.to(device))
