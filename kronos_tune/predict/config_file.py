"""Prediction config files: what `kronos-tune predict --config FILE` reads and the predict benchmark writes
(`kronos-tune benchmark --task predict` -> RUN/recommended.toml).

A prediction config is one ``[predict]`` table. Its keys are the names of
PredictConfig's fields, i.e. predict's long flags with underscores (``--pred-len``
-> ``pred_len``); every key is optional, and a flag given on the command line
wins over the file::

    [predict]
    size = "mini"           # random weights of a size; or checkpoint = "DIR" with tokenizer = "DIR"
    lookback = 400
    pred_len = 30
    sample_count = 1
    max_batch_size = 100    # sequences (series x sample paths) per chunk; absent: from free memory
    window_mode = "refill"  # refill (exact) or shift (approximate)
    amp = "none"            # none, bf16 or fp16 (CUDA)
    weight_dtype = "fp32"   # fp32, or bf16: the weights held in bf16 (under bf16 autocast)
    cuda_graphs = false     # replay the cached one-token steps as CUDA graphs; absent: on with CUDA
    kv_cache = true         # false: recompute the whole window for every token (the reference method)
    nproc = 1               # processes on this node (one per GPU); > 1 shards the series with torchrun
    chunk_series = 64       # series per chunk (predict's unit of work, resume and sharing); absent: from the job
    runner = "torchrun"     # or "ray": Ray Data actors predict the chunks (ray_address, ray_actors; docs/ray.md)

Unknown keys and values of the wrong type are one line naming the file and the key (kronos_core.validate).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kronos_core.files import dumps_toml, load_toml
from kronos_core.validate import check_fields, check_known_keys, check_value, field_types
from kronos_tune.errors import KronosTuneError

TABLE = "predict"
PATH_KEYS = ("checkpoint", "tokenizer", "out")
SETTINGS_KEYS = ("max_batch_size", "window_mode", "amp", "weight_dtype", "cuda_graphs", "kv_cache", "nproc",
                 "chunk_series")  # what the benchmark decides
EXCLUSIVE = (("size", ("checkpoint", "tokenizer")), ("checkpoint", ("size",)), ("data", ("synthetic",)),
             ("synthetic", ("data",)))  # a flag on the command line drops these keys of the file


@dataclass(frozen=True)
class PredictFileKeys:
    """The keys a [predict] table may hold (TOML types; PredictConfig has the meaning of each)."""

    size: str | None = None
    checkpoint: str | None = None
    tokenizer: str | None = None
    data: list[str] | None = None
    synthetic: int | None = None
    lookback: int | None = None
    pred_len: int | None = None
    sample_count: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    device: Literal["auto", "cpu", "cuda"] | None = None
    amp: Literal["none", "bf16", "fp16"] | None = None
    weight_dtype: Literal["fp32", "bf16"] | None = None
    max_batch_size: int | None = None
    max_context: int | None = None
    window_mode: Literal["refill", "shift"] | None = None
    cuda_graphs: bool | None = None
    kv_cache: bool | None = None
    nproc: int | None = None
    holdout: bool | None = None
    symbol_column: str | None = None
    date_format: str | None = None
    calendar: str | None = None
    out: str | None = None
    chunk_series: int | None = None
    runner: Literal["torchrun", "ray"] | None = None
    ray_address: str | None = None
    ray_actors: int | None = None


def _training_keys() -> set[str]:
    from kronos_core.train import TrainConfig

    return {spec.name for spec in dataclasses.fields(TrainConfig)}


def read_predict_file(path: str | os.PathLike) -> dict[str, Any]:
    """The [predict] table of `path`, checked: only the keys it holds, paths as Path and data as a tuple of
    Paths. A training config, a file without the table or an unknown key is one KronosTuneError line."""
    where = str(path)
    data = load_toml(path, what="prediction config", fix="give the recommended.toml of `kronos-tune benchmark "
                                                           "--task predict` or a file with a [predict] table")
    if TABLE not in data:
        training = sorted(set(data) & _training_keys())
        if training:
            raise KronosTuneError(
                f"{where}: a training config (TrainConfig keys such as '{training[0]}'), not a prediction config; "
                f"train with `kronos-tune train --config {where}`, or give predict a file with a [predict] table "
                f"(the recommended.toml of `kronos-tune benchmark --task predict`)")
        raise KronosTuneError(f"{where}: no [predict] table; a prediction config holds its keys under [predict] "
                              f"(keys: {', '.join(field_types(PredictFileKeys))})")
    check_known_keys(data, (TABLE,), where=where, noun="table or key",
                     fix=f"a prediction config holds one [{TABLE}] table and nothing else", error=KronosTuneError)
    table = check_value(TABLE, data[TABLE], dict, where=where, error=KronosTuneError)
    values = check_fields(table, PredictFileKeys, where=where, prefix=f"{TABLE}.", error=KronosTuneError)
    for key in PATH_KEYS:
        if values.get(key) is not None:
            values[key] = Path(values[key])
    if values.get("data") is not None:
        values["data"] = tuple(Path(item) for item in values["data"])
    return values


def merge_predict_file(values: dict[str, Any], given: set[str], from_file: dict[str, Any]) -> dict[str, Any]:
    """The command's values with the file's: a key of the file is used unless its flag was `given` on the command
    line; a given --size / --checkpoint / --data / --synthetic also drops the file's keys it excludes."""
    dropped = {key for flag, keys in EXCLUSIVE if flag in given for key in keys}
    merged = dict(values)
    for key, value in from_file.items():
        if key not in given and key not in dropped:
            merged[key] = value
    return merged


def predict_file_toml(settings: dict[str, Any], header: list[str]) -> str:
    """A [predict] table of `settings` (None values left out), `header` as comment lines."""
    unknown = set(settings) - set(field_types(PredictFileKeys))
    if unknown:
        raise ValueError(f"not prediction config keys: {sorted(unknown)}")
    table = {key: str(value) if isinstance(value, Path) else value for key, value in settings.items()}
    return dumps_toml({TABLE: table}, header="\n".join(header))
