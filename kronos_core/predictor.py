"""KronosPredictor: DataFrames in, DataFrames out, with the reference's signatures.

Beyond the reference: modules in eval mode; a key/value cache (exact while the
window has not slid, see generation.py); one tokenizer encode per series, not
per sample copy; s1 head logits for the last position only; series of
different lengths grouped by length (each group exact, nothing truncated);
work split into chunks so thousands of series fit in memory; optional return
of every sample path; optional bf16/fp16 autocast.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from kronos_core.data import FEATURE_COLUMNS, PRICE_COLUMNS, calendar_features, fill_volume_amount, normalize_window
from kronos_core.errors import KronosError
from kronos_core.generation import WINDOW_MODES, SamplingParams, generate_tokens
from kronos_core.model import Kronos
from kronos_core.tokenizer import KronosTokenizer

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
CPU_MAX_ROWS = 256  # larger batches stop paying off on CPU and only cost memory
GPU_MAX_ROWS = 8192


@dataclass
class _Series:
    """One input series after validation and normalization."""

    x: np.ndarray        # [L, 6] normalized, clipped
    x_stamp: np.ndarray  # [L, 5]
    y_stamp: np.ndarray  # [pred_len, 5]
    mean: np.ndarray
    std: np.ndarray
    index: pd.Index


def default_device() -> str:
    if torch.cuda.is_available():
        return "cuda:0"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def available_memory_bytes(device: torch.device) -> int:
    """Free memory on the device (CUDA) or available RAM (CPU), without extra dependencies."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 * 2**30


def bytes_per_sequence(model: Kronos, tokenizer: KronosTokenizer, window: int, element_bytes: int) -> int:
    """Rough upper bound of the memory one sequence in flight needs during prediction:
    its key/value cache plus the transient activations of a prefill over the window."""
    d = model.d_model
    ff = model.transformer[0].ffn.w1.out_features
    cache = int(model.kv_cache_bytes(1, window, element_bytes))
    prefill = window * (8 * d + 3 * ff + 4 * 2 ** model.s1_bits) * max(element_bytes, 4)
    attention_scores = model.n_heads * window * window * 4
    tokenizer_pass = window * 12 * tokenizer.d_model * 4
    return cache + prefill + attention_scores + tokenizer_pass


def _prepare(df: pd.DataFrame, x_timestamp, y_timestamp, pred_len: int, clip: float, where: str) -> _Series:
    if not isinstance(df, pd.DataFrame):
        raise KronosError(f"{where}: input must be a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in PRICE_COLUMNS if c not in df.columns]
    if missing:
        raise KronosError(f"{where}: missing price column(s) {missing}; found {list(df.columns)}; "
                          f"provide open, high, low, close")
    frame = fill_volume_amount(df)
    values = frame[list(FEATURE_COLUMNS)]
    try:
        x = values.to_numpy(dtype=np.float64)
    except (TypeError, ValueError):
        bad = next(c for c in FEATURE_COLUMNS if not pd.api.types.is_numeric_dtype(values[c]))
        raise KronosError(f"{where}: column '{bad}' is not numeric; clean it before predicting") from None
    if not np.isfinite(x).all():
        row, col = np.argwhere(~np.isfinite(x))[0]
        kind = "NaN" if np.isnan(x[row, col]) else "inf"
        raise KronosError(f"{where}: {kind} in column '{FEATURE_COLUMNS[col]}' at row {row}; "
                          f"fill or drop it before predicting")
    if len(x) == 0:
        raise KronosError(f"{where}: the history is empty; pass at least one row")
    x_ts = pd.Series(pd.to_datetime(pd.Series(x_timestamp).to_numpy()))
    y_ts = pd.Series(pd.to_datetime(pd.Series(y_timestamp).to_numpy()))
    if len(x_ts) != len(x):
        raise KronosError(f"{where}: x_timestamp has {len(x_ts)} entries but the DataFrame has {len(x)} rows")
    if len(y_ts) != pred_len:
        raise KronosError(f"{where}: y_timestamp has {len(y_ts)} entries but pred_len={pred_len}; "
                          f"pass exactly pred_len future timestamps")
    x_norm, mean, std = normalize_window(x.astype(np.float32), clip=clip)
    index = y_timestamp if isinstance(y_timestamp, pd.Index) else pd.Index(y_timestamp)
    return _Series(x_norm, calendar_features(x_ts), calendar_features(y_ts), mean, std, index)


class KronosPredictor:
    """Batch prediction for Kronos with the reference's interface.

    Extra keywords (all optional): `amp` ("bf16" | "fp16" | None) autocasts on CUDA
    (and bf16 on CPU); `window_mode` ("refill" exact | "shift" approximate, see
    generation.py); `use_cache=False` recomputes the window each step like the
    reference; `max_batch_size` caps the sequences (series x sample_count) run
    at once, default derived from free memory.

    `phase_clock`, when set, is called with "encode", "step" (after each
    generated step) and "decode" as each phase of a chunk ends; benchmarks use
    it to time the phases (it should synchronize the device itself).
    """

    def __init__(self, model: Kronos, tokenizer: KronosTokenizer, device: str | torch.device | None = None,
                 max_context: int = 512, clip: float = 5, amp: str | None = None, window_mode: str = "refill",
                 use_cache: bool = True, max_batch_size: int | None = None):
        if amp is not None and amp not in AMP_DTYPES:
            raise KronosError(f"amp must be one of {sorted(AMP_DTYPES)} or None, got {amp!r}")
        if window_mode not in WINDOW_MODES:
            raise KronosError(f"window_mode must be one of {WINDOW_MODES}, got {window_mode!r}")
        if max_context < 1:
            raise KronosError(f"max_context must be >= 1, got {max_context}")
        self.device = torch.device(device if device is not None else default_device())
        if amp == "fp16" and self.device.type != "cuda":
            raise KronosError("amp='fp16' needs a CUDA device; use amp='bf16' or None on CPU")
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer.to(self.device).eval()
        self.max_context = max_context
        self.clip = clip
        self.amp = amp
        self.window_mode = window_mode
        self.use_cache = use_cache
        self.max_batch_size = max_batch_size
        self.phase_clock: Callable[[str], None] | None = None
        self.price_cols = list(PRICE_COLUMNS)
        self.vol_col, self.amt_vol = "volume", "amount"

    # Public API --------------------------------------------------------------------------

    def predict(self, df: pd.DataFrame, x_timestamp, y_timestamp, pred_len: int, T: float = 1.0, top_k: int = 0,
                top_p: float = 0.9, sample_count: int = 1, verbose: bool = True, return_samples: bool = False):
        """Predict one series: a DataFrame of pred_len rows indexed by y_timestamp
        (with return_samples=True, also an array [sample_count, pred_len, 6] of every path)."""
        frames, samples = self.predict_batch([df], [x_timestamp], [y_timestamp], pred_len, T, top_k, top_p,
                                             sample_count, verbose, return_samples=True)
        return (frames[0], samples[0]) if return_samples else frames[0]

    def predict_batch(self, df_list: Sequence[pd.DataFrame], x_timestamp_list: Sequence, y_timestamp_list: Sequence,
                      pred_len: int, T: float = 1.0, top_k: int = 0, top_p: float = 0.9, sample_count: int = 1,
                      verbose: bool = True, return_samples: bool = False, max_batch_size: int | None = None):
        """Predict many series; they may differ in history length (grouped by length)."""
        if not isinstance(df_list, (list, tuple)) or not isinstance(x_timestamp_list, (list, tuple)) \
                or not isinstance(y_timestamp_list, (list, tuple)):
            raise KronosError("df_list, x_timestamp_list and y_timestamp_list must be lists or tuples")
        if not len(df_list) == len(x_timestamp_list) == len(y_timestamp_list):
            raise KronosError(f"got {len(df_list)} DataFrames, {len(x_timestamp_list)} x_timestamp and "
                              f"{len(y_timestamp_list)} y_timestamp entries; pass one of each per series")
        if pred_len < 1:
            raise KronosError(f"pred_len must be >= 1, got {pred_len}")
        if sample_count < 1:
            raise KronosError(f"sample_count must be >= 1, got {sample_count}")
        params = SamplingParams(temperature=T, top_k=top_k, top_p=top_p)
        series = [_prepare(df, xs, ys, pred_len, self.clip, f"series {i}")
                  for i, (df, xs, ys) in enumerate(zip(df_list, x_timestamp_list, y_timestamp_list))]
        longest = max(len(s.x) for s in series)
        if longest > self.max_context:
            warnings.warn(f"a history of {longest} rows is longer than max_context={self.max_context}: every row "
                          f"is used for normalization and tokenization, the predictor sees the last "
                          f"{self.max_context} tokens", stacklevel=2)
        rows_per_chunk = self.rows_per_chunk(max_batch_size or self.max_batch_size,
                                              longest, pred_len)
        series_per_chunk = max(1, rows_per_chunk // sample_count)
        by_length: dict[int, list[int]] = defaultdict(list)
        for i, item in enumerate(series):
            by_length[len(item.x)].append(i)
        chunks = [members[k:k + series_per_chunk] for members in by_length.values()
                  for k in range(0, len(members), series_per_chunk)]

        paths: list[np.ndarray | None] = [None] * len(series)
        with self._progress(verbose, len(chunks) * pred_len, len(series)) as advance:
            def on_step(_step: int) -> None:
                advance(0, 1)
                self._mark("step")

            for chunk in chunks:
                result = self._generate_chunk([series[i] for i in chunk], pred_len, params, sample_count,
                                              on_step=on_step)
                for position, i in enumerate(chunk):
                    paths[i] = result[position]
                advance(len(chunk), 0)

        frames, samples = [], []
        for item, normalized in zip(series, paths):
            scaled = normalized * (item.std + 1e-5) + item.mean
            samples.append(scaled)
            frames.append(pd.DataFrame(normalized.mean(axis=0) * (item.std + 1e-5) + item.mean,
                                       columns=list(FEATURE_COLUMNS), index=item.index))
        return (frames, samples) if return_samples else frames

    # Internals ---------------------------------------------------------------------------

    def rows_per_chunk(self, requested: int | None, history: int, pred_len: int) -> int:
        """Sequences run at once: `requested`, else as many as 40% of free memory holds."""
        if requested is not None:
            if requested < 1:
                raise KronosError(f"max_batch_size must be >= 1, got {requested}")
            return requested
        window = min(self.max_context, history + pred_len)
        element_bytes = 2 if self.amp else 4
        per_row = bytes_per_sequence(self.model, self.tokenizer, window, element_bytes)
        fit = int(0.4 * available_memory_bytes(self.device) // per_row)
        return max(1, min(fit, GPU_MAX_ROWS if self.device.type == "cuda" else CPU_MAX_ROWS))

    def _mark(self, phase: str) -> None:
        if self.phase_clock is not None:
            self.phase_clock(phase)

    def _autocast(self):
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=AMP_DTYPES[self.amp])

    @torch.inference_mode()
    def _generate_chunk(self, chunk: list[_Series], pred_len: int, params: SamplingParams, sample_count: int,
                        on_step) -> list[np.ndarray]:
        """Normalized sample paths [sample_count, pred_len, 6] for each series of one length group."""
        device = self.device
        x = torch.from_numpy(np.stack([s.x for s in chunk])).to(device)
        stamps = torch.from_numpy(np.stack([np.concatenate([s.x_stamp, s.y_stamp]) for s in chunk])).to(device)
        x = torch.clamp(x, -self.clip, self.clip)
        with self._autocast():
            s1, s2 = self.tokenizer.encode(x, half=True)
            self._mark("encode")
            if sample_count > 1:
                s1, s2 = s1.repeat_interleave(sample_count, 0), s2.repeat_interleave(sample_count, 0)
                stamps = stamps.repeat_interleave(sample_count, 0)
            cache_dtype = AMP_DTYPES[self.amp] if self.amp else None
            new_s1, new_s2 = generate_tokens(self.model, s1, s2, stamps, pred_len, self.max_context, params,
                                             use_cache=self.use_cache, window_mode=self.window_mode,
                                             cache_dtype=cache_dtype, on_step=on_step)
            total = s1.shape[1] + pred_len
            start = max(0, total - self.max_context)
            full_s1 = torch.cat([s1, new_s1], dim=1)[:, start:]
            full_s2 = torch.cat([s2, new_s2], dim=1)[:, start:]
            decoded = self.tokenizer.decode([full_s1, full_s2], half=True)[:, -pred_len:]
        paths = decoded.float().reshape(len(chunk), sample_count, pred_len, -1).cpu().numpy()
        self._mark("decode")
        return list(paths)

    @contextlib.contextmanager
    def _progress(self, verbose: bool, total_steps: int, total_series: int):
        """Yield advance(series_done, steps_done); a Rich bar when verbose and Rich is installed."""
        if not verbose:
            yield lambda series, steps: None
            return
        try:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
        except ImportError:  # kronos_core does not require Rich
            yield lambda series, steps: None
            return
        columns = (TextColumn("[bold]predict"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("series {task.fields[series]}/" + str(total_series)), TimeRemainingColumn())
        with Progress(*columns, transient=True) as progress:
            task = progress.add_task("steps", total=total_steps, series=0)
            done = {"series": 0}

            def advance(series: int, steps: int) -> None:
                done["series"] += series
                progress.update(task, advance=steps, series=done["series"])

            yield advance
