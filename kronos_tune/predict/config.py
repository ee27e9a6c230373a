"""What `kronos-tune predict` is asked to do, checked before any data or weights are read.

`InputSpec` is what `predict` and `backtest` both start from: the windows, the model (a size or checkpoint
folders), the data; `PredictConfig` adds the prediction settings.
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass
from pathlib import Path

from kronos_core.data.day_month import check_date_format
from kronos_core.data.kline import find_data_files
from kronos_core.errors import KronosError, one_line
from kronos_core.launch import LaunchSpec, check_launch
from kronos_core.optional import require
from kronos_core.predict.spec import PredictorSpec
from kronos_core.sizes import size_spec
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.output import check_output_path
from kronos_tune.predict.times import exchange_calendar


@dataclass(frozen=True)
class InputSpec:
    """size: random weights of a named size; checkpoint + tokenizer: published-format folders or Hugging Face
    hub ids (OWNER/NAME[@REVISION], kronos_core.hub); offline: never download one.
    data: files (or folders); synthetic: that many generated series instead. date_format: how the files write
    their dates (strptime directives; None: read as they allow, kronos_core.data.day_month)."""

    lookback: int
    pred_len: int
    size: str | None = None
    checkpoint: Path | None = None
    tokenizer: Path | None = None
    data: tuple[Path, ...] = ()
    synthetic: int | None = None
    offline: bool = False
    date_format: str | None = None


def check_input_spec(config: InputSpec) -> None:
    """The flags both commands share, judged before any data or weights are read."""
    if (config.size is None) == (config.checkpoint is None):
        raise KronosTuneError("give exactly one of --checkpoint DIR (with --tokenizer DIR) or --size NAME")
    if config.checkpoint is not None and config.tokenizer is None:
        raise KronosTuneError(f"--checkpoint {config.checkpoint} needs --tokenizer DIR too: the tokenizer is a "
                              "separate checkpoint folder")
    if config.size is not None:
        try:
            size_spec(config.size)
        except KronosError as error:
            raise KronosTuneError(f"--size: {error}") from None
    if config.data and config.synthetic is not None:
        raise KronosTuneError("give either --data or --synthetic N, not both")
    if config.date_format is not None:
        if not config.data:
            raise KronosTuneError(f"--date-format {config.date_format!r} says how --data files write their dates; "
                                  "give them with --data or leave it out")
        try:
            check_date_format(config.date_format)
        except KronosError as error:
            raise KronosTuneError(str(error)) from None
    for flag, value in (("--lookback", config.lookback), ("--pred-len", config.pred_len)):
        if value < 1:
            raise KronosTuneError(f"{flag} {value}: must be at least 1")


DEVICES = ("auto", "cpu", "cuda")
AMP_CHOICES = ("none", "bf16", "fp16")
WEIGHT_DTYPES = ("fp32", "bf16")
DEFAULT_MAX_CONTEXT = 512
RUNNERS = ("torchrun", "ray")
_RAY_ANSWER_S = 5.0  # how long a --ray-address has to accept a connection
RANDOM_WEIGHTS_NOTE = "random weights: predictions are meaningless, for timing only"


@dataclass(frozen=True)
class PredictConfig(InputSpec):
    """Everything `kronos-tune predict` was asked to do; see the command's --help for each field."""

    sample_count: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.9
    out: Path | None = None
    device: str = "auto"
    amp: str = "none"
    weight_dtype: str = "fp32"  # bf16: the weights held in bf16 and run under bf16 autocast
    max_batch_size: int | None = None
    max_context: int | None = None
    seed: int = 0
    holdout: bool = False
    symbol_column: str | None = None  # --data files are panels: one long table, this column names each series
    window_mode: str = "refill"
    cuda_graphs: bool | None = None  # cached one-token steps as CUDA graphs; None: on when the device is CUDA
    kv_cache: bool = True  # False: the reference method, the whole window recomputed for every token
    nproc: int = 1
    nnodes: str | None = None
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_backend: str | None = None
    calendar: str | None = None  # exchange calendar for future stamps (e.g. XSHG); None: the series' own grid
    quantiles: tuple[float, ...] = ()  # levels in (0, 1): per-bar quantiles of the sample paths (quantiles.py)
    resume: bool = False               # continue the job whose work folder sits beside --out
    chunk_series: int | None = None    # series per chunk of a --out job (None: chunk_size.choose_chunk_series)
    max_restarts: int = 0              # torchrun restarts a failed group this many times (it continues)
    runner: str = "torchrun"           # who predicts the chunks: this process or torchrun's ranks, or Ray actors
    ray_address: str | None = None     # --runner ray: the cluster (None: $RAY_ADDRESS, else a Ray here)
    ray_actors: int | None = None      # --runner ray: actors in the pool (None: one per GPU or CPU of the cluster)

    @property
    def launch(self) -> LaunchSpec:
        return LaunchSpec(self.nproc, self.nnodes, self.node_rank, self.rdzv_endpoint, self.rdzv_id,
                          self.rdzv_backend, self.max_restarts)

    @property
    def elsewhere(self) -> bool:
        """The chunks are predicted by other processes (torchrun's ranks or Ray's actors), not this one."""
        return self.launch.launched or self.runner == "ray"


# Checks before any work ----------------------------------------------------------------------


def check_config(config: PredictConfig) -> None:
    """Every flag that can be judged without reading data or weights."""
    check_input_spec(config)
    if config.synthetic is not None and config.synthetic < 1:
        raise KronosTuneError(f"--synthetic {config.synthetic}: ask for at least 1 series")
    if config.sample_count < 1:
        raise KronosTuneError(f"--sample-count {config.sample_count}: must be at least 1")
    if config.max_batch_size is not None and config.max_batch_size < 1:
        raise KronosTuneError(f"--max-batch-size {config.max_batch_size}: must be at least 1")
    if config.max_context is not None and config.max_context < 1:
        raise KronosTuneError(f"--max-context {config.max_context}: must be at least 1")
    if not config.temperature > 0 or not math.isfinite(config.temperature):
        raise KronosTuneError(f"--T {config.temperature}: the temperature must be a number > 0")
    if config.top_k < 0:
        raise KronosTuneError(f"--top-k {config.top_k}: must be >= 0 (0 = off, 1 = greedy)")
    if not 0 < config.top_p <= 1:
        raise KronosTuneError(f"--top-p {config.top_p}: must be in (0, 1]")
    if config.device not in DEVICES:
        raise KronosTuneError(f"--device {config.device}: choose one of {', '.join(DEVICES)}")
    if config.amp not in AMP_CHOICES:
        raise KronosTuneError(f"--amp {config.amp}: choose one of {', '.join(AMP_CHOICES)}")
    if config.weight_dtype not in WEIGHT_DTYPES:
        raise KronosTuneError(f"--weight-dtype {config.weight_dtype}: choose one of {', '.join(WEIGHT_DTYPES)}")
    if config.weight_dtype == "bf16" and config.amp not in ("none", "bf16"):
        raise KronosTuneError(f"--weight-dtype bf16 runs under bf16 autocast; --amp {config.amp} contradicts it: "
                              f"leave --amp out")
    if config.device == "cuda" and config.runner != "ray" and not _cuda_visible():  # Ray's actors hold the GPUs
        raise KronosTuneError("--device cuda: no CUDA device is visible to torch; use --device cpu or auto")
    if config.amp == "fp16" and resolve_device(config.device) == "cpu":
        raise KronosTuneError("--amp fp16 needs a CUDA device; use --amp bf16 or none on CPU")
    if config.window_mode not in ("refill", "shift"):
        raise KronosTuneError(f"--window-mode {config.window_mode}: choose refill (exact) or shift (approximate)")
    if config.nproc < 1:
        raise KronosTuneError(f"--nproc {config.nproc}: must be at least 1")
    if config.cuda_graphs and resolve_device(config.device) == "cpu":
        raise KronosTuneError("--cuda-graphs needs a CUDA device; leave it out (on with CUDA) or use --no-cuda-graphs")
    if not config.kv_cache and config.nproc > 1:
        raise KronosTuneError(f"--no-kv-cache with --nproc {config.nproc}: the full-recompute reference runs in one "
                              f"process; use --nproc 1 or the KV cache")
    if config.symbol_column is not None and not config.data:
        raise KronosTuneError("--symbol-column reads panel files; give them with --data")
    if config.out is not None:
        check_output_path(config.out)
    check_job_flags(config)
    if config.calendar is not None:
        exchange_calendar(config.calendar)  # a missing package or an unknown name fails before any data is read
    if config.quantiles:
        check_quantiles(config)
    check_data_paths(config)


def check_data_paths(config: InputSpec) -> None:
    """A missing --data path or a file of another kind: one line before torch loads (the flags come first)."""
    if config.data:
        find_data_files(config.data)


def check_quantiles(config: PredictConfig) -> None:
    """Quantiles are taken over the sample paths of one process."""
    levels = ",".join(f"{level:g}" for level in config.quantiles)
    if not all(0 < level < 1 for level in config.quantiles) or list(config.quantiles) != sorted(set(config.quantiles)):
        raise KronosTuneError(f"--quantiles {levels}: give increasing levels in (0, 1), e.g. 0.1,0.5,0.9")
    if config.sample_count < 2:
        raise KronosTuneError(f"--quantiles {levels} needs --sample-count 2 or more (got {config.sample_count}): "
                              f"the quantiles are taken over the sample paths; e.g. --sample-count 20")


def check_job_flags(config: PredictConfig) -> None:
    """The flags of a large job: a work folder needs --out, on several nodes on storage they all share."""
    if config.resume and config.out is None:
        raise KronosTuneError("--resume continues a job that writes --out FILE; give the same --out as the "
                              "interrupted run")
    if config.chunk_series is not None and config.chunk_series < 1:
        raise KronosTuneError(f"--chunk-series {config.chunk_series}: must be at least 1")
    if config.max_restarts < 0:
        raise KronosTuneError(f"--max-restarts {config.max_restarts}: must be 0 or more")
    if config.max_restarts and not config.launch.launched:
        raise KronosTuneError(f"--max-restarts {config.max_restarts} restarts torchrun's ranks; add --nproc N "
                              f"(or the --nnodes flags), or leave it out"
                              + ("; Ray restarts a dead actor itself" if config.runner == "ray" else ""))
    check_runner(config)
    check_launch(config.launch)  # before anything is written
    if config.launch.multi_node and config.out is None:
        raise KronosTuneError(f"--nnodes {config.nnodes} needs --out FILE on storage every node shares (its work "
                              f"folder holds the ranks' parts)")


def check_runner(config: PredictConfig) -> None:
    """--runner and the Ray flags; with Ray: installed, and a cluster address that answers."""
    if config.runner not in RUNNERS:
        raise KronosTuneError(f"--runner {config.runner}: choose one of {', '.join(RUNNERS)}")
    if config.runner != "ray":
        for flag, value in (("--ray-address", config.ray_address), ("--ray-actors", config.ray_actors)):
            if value is not None:
                raise KronosTuneError(f"{flag} {value} applies to --runner ray; add it, or leave {flag} out")
        return
    if config.launch.launched:
        raise KronosTuneError("--runner ray with --nproc/--nnodes/--rdzv-*: Ray places its actors itself (size the "
                              "pool with --ray-actors N); leave the torchrun flags out")
    if config.ray_actors is not None and config.ray_actors < 1:
        raise KronosTuneError(f"--ray-actors {config.ray_actors}: must be at least 1")
    require_ray()
    check_address(config.ray_address)


def require_ray() -> None:
    """Ray Data importable, or one line saying how to install it (before any work)."""
    require("ray", "--runner ray", instead="leave --runner out for torchrun")


def check_address(address: str | None) -> None:
    """A HOST:PORT (or ray://HOST:PORT) cluster address that answers, checked before any work: Ray itself
    retries an unreachable address for minutes. `local`, `auto` and none are Ray's own rules."""
    if address is None or address in ("local", "auto"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise KronosTuneError(f"--ray-address {address}: give HOST:PORT of the cluster's head (e.g. 10.0.0.5:6379), "
                              f"ray://HOST:PORT of a Ray client server, `auto` or `local`")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_RAY_ANSWER_S):
            pass
    except OSError as error:
        raise KronosTuneError(f"--ray-address {address}: no Ray cluster answers there ({one_line(error, typed=False)}); "
                              f"start it (`ray start --head` on its head node) or check the address") from None


def resolve_max_context(config: PredictConfig) -> int:
    if config.max_context is not None:
        return config.max_context
    return size_spec(config.size).context if config.size is not None else DEFAULT_MAX_CONTEXT


def predictor_spec(config: PredictConfig, weights: dict | None = None) -> PredictorSpec:
    """The predictor a prediction job runs: `weights` are the resolved --checkpoint/--tokenizer folders
    (`kronos_tune.predict.job.resolve_weights`; a hub id is never looked up again by a rank or actor)."""
    weights = weights or {}
    checkpoint, tokenizer = weights.get("checkpoint"), weights.get("tokenizer")
    return PredictorSpec(size=config.size, checkpoint=None if checkpoint is None else str(checkpoint.path),
                         tokenizer=None if tokenizer is None else str(tokenizer.path), seed=config.seed,
                         device=resolve_device(config.device), amp=None if config.amp == "none" else config.amp,
                         weight_dtype=None if config.weight_dtype == "fp32" else config.weight_dtype,
                         max_context=resolve_max_context(config), window_mode=config.window_mode,
                         use_cache=config.kv_cache, max_batch_size=config.max_batch_size,
                         cuda_graphs=config.cuda_graphs)


def _cuda_visible() -> bool:
    import torch  # only here: the other checks answer bad input without loading torch

    return torch.cuda.is_available()


def bf16_flag(config: PredictConfig) -> str | None:
    """The flag that asked predict for bf16, if one did."""
    return "--amp bf16" if config.amp == "bf16" else "--weight-dtype bf16" if config.weight_dtype == "bf16" else None


def resolve_device(device: str) -> str:
    if device == "auto":
        from kronos_core.predict.predictor import default_device

        return default_device()
    return "cuda:0" if device == "cuda" else device
