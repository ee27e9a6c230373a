"""KronosPredictor: DataFrames in, DataFrames out, with the reference's signatures.

Beyond the reference: modules in eval mode; a key/value cache (exact while the
window has not slid, see generation.py); one tokenizer encode per series, not
per sample copy; s1 head logits for the last position only; series of
different lengths grouped by length (each group exact, nothing truncated);
work split into calls of `max_batch_size` sequences (call_size.py) so
thousands of series fit in memory; optional return of every sample path;
optional bf16/fp16 autocast, or the weights held in bf16.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from kronos_core.data.kline import FEATURE_COLUMNS, PRICE_COLUMNS
from kronos_core.errors import KronosError
from kronos_core.predict.call_size import (bytes_per_sequence, cpu_rows_within_blocks, memory_fit, rows_per_call,
                                           series_per_call)
from kronos_core.predict.generation import WINDOW_MODES, SamplingParams, generate_tokens
from kronos_core.hostmem import available_ram_bytes
from kronos_core.model import Kronos
from kronos_core.predict.arrays import N_FEATURES, NORM_EPS, normalize, prepare_lists, to_device, to_host
from kronos_core.predict.step_bar import StepBar
from kronos_core.predict.streams import RowStreams, as_int64_keys, pad_rows, series_key
from kronos_core.tokenizer import KronosTokenizer

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
WEIGHT_DTYPES = {"bf16": torch.bfloat16}


def default_device() -> str:
    if torch.cuda.is_available():
        return "cuda:0"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def available_memory_bytes(device: torch.device) -> int:
    """Free memory on the device (CUDA) or available RAM (anything else)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return available_ram_bytes()


@dataclass(frozen=True)
class PredictProgress:
    """Where a prediction call stands: decode steps over all calls, and series whose call is finished."""

    steps_done: int
    steps_total: int
    series_done: int
    series_total: int


ProgressCallback = Callable[[PredictProgress], None]


@contextlib.contextmanager
def _progress(on_progress: ProgressCallback | None, steps_total: int, series_total: int,
              verbose: bool = False) -> Iterator[Callable[[int, int], None]]:
    """Yield advance(series, steps), which reports the running totals to `on_progress` (if any) and, with
    `verbose`, draws the steps as a bar on stderr."""
    bar = StepBar(steps_total) if verbose else None
    if on_progress is None and bar is None:
        yield lambda series, steps: None
        return
    done = [0, 0]  # steps, series

    def advance(series: int, steps: int) -> None:
        done[0] += steps
        done[1] += series
        if bar is not None and steps:
            bar.advance(steps)
        if on_progress is not None:
            on_progress(PredictProgress(done[0], steps_total, done[1], series_total))

    try:
        yield advance
    finally:
        if bar is not None:
            bar.close()


class KronosPredictor:
    """Batch prediction for Kronos with the reference's interface.

    Extra keywords (all optional): `amp` ("bf16" | "fp16" | None) autocasts on CUDA
    (and bf16 on CPU); `window_mode` ("refill" exact | "shift" approximate, see
    generation.py); `use_cache=False` recomputes the window each step like the
    reference; `max_batch_size` caps the sequences (series x sample_count) run
    at once, default derived from free memory; `cuda_graphs` (None = on when
    the device is CUDA) replays each cached one-token step as CUDA graphs over
    a fixed-shape cache; `static_cache=True` runs those fixed-shape steps
    eagerly (see static_cache.py). `weight_dtype="bf16"` holds a bf16 copy of the model and the tokenizer
    (the caller's modules are left as they are) and runs them under bf16 autocast: each decode step reads half
    the weight bytes, and the activations between matmuls stay bf16 too.

    Sampling: with `keys` (and a `seed`), every (series, sample path) draws from its own random stream
    (streams.py), so a series' sampled forecast is the same alone, in any batch, order or call. Without
    `keys`, rows draw from torch's global generator in batch order, as before.

    `phase_clock`, when set, is called as each phase ends: "prepare" (host
    conversion), per length group "h2d" (copy to the device and normalization),
    per call "encode", "step" (after each generated step) and "decode", per
    group "d2h" (de-normalization and copy back); output frames come after the
    last mark. Benchmarks use it to time the phases (it should synchronize the
    device itself). `token_sink`, when set, is called per call with the generated s1 and s2 ids
    ([rows, pred_len] each, rows = series x sample_count in row order): agreement statistics use it.
    """

    def __init__(self, model: Kronos, tokenizer: KronosTokenizer, device: str | torch.device | None = None,
                 max_context: int = 512, clip: float = 5, amp: str | None = None, window_mode: str = "refill",
                 use_cache: bool = True, max_batch_size: int | None = None, cuda_graphs: bool | None = None,
                 static_cache: bool = False, weight_dtype: str | None = None):
        if amp is not None and amp not in AMP_DTYPES:
            raise KronosError(f"amp must be one of {sorted(AMP_DTYPES)} or None, got {amp!r}")
        if weight_dtype is not None and weight_dtype not in WEIGHT_DTYPES:
            raise KronosError(f"weight_dtype must be one of {sorted(WEIGHT_DTYPES)} or None, got {weight_dtype!r}")
        if weight_dtype is not None and amp not in (None, weight_dtype):
            raise KronosError(f"weight_dtype={weight_dtype!r} runs under {weight_dtype} autocast; amp={amp!r} "
                              f"contradicts it: leave amp None")
        if window_mode not in WINDOW_MODES:
            raise KronosError(f"window_mode must be one of {WINDOW_MODES}, got {window_mode!r}")
        if max_context < 1:
            raise KronosError(f"max_context must be >= 1, got {max_context}")
        self.device = torch.device(device if device is not None else default_device())
        if amp == "fp16" and self.device.type != "cuda":
            raise KronosError("amp='fp16' needs a CUDA device; use amp='bf16' or None on CPU")
        if weight_dtype is not None:
            model, tokenizer = (copy.deepcopy(module).to(WEIGHT_DTYPES[weight_dtype]) for module in (model, tokenizer))
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer.to(self.device).eval()
        self.max_context = max_context
        self.clip = clip
        self.weight_dtype = weight_dtype
        self.amp = weight_dtype or amp
        self.window_mode = window_mode
        self.use_cache = use_cache
        self.max_batch_size = max_batch_size
        if cuda_graphs and self.device.type != "cuda":
            raise KronosError("cuda_graphs=True needs a CUDA device; use None (auto) or False")
        self.cuda_graphs = cuda_graphs
        self.static_cache = static_cache
        self.phase_clock: Callable[[str], None] | None = None
        self.token_sink: Callable[[torch.Tensor, torch.Tensor], None] | None = None
        self.price_cols = list(PRICE_COLUMNS)
        self.vol_col, self.amt_vol = "volume", "amount"

    # Public API --------------------------------------------------------------------------

    def predict(self, df: pd.DataFrame, x_timestamp, y_timestamp, pred_len: int, T: float = 1.0, top_k: int = 0,
                top_p: float = 0.9, sample_count: int = 1, verbose: bool = True, return_samples: bool = False,
                on_progress: ProgressCallback | None = None, key: str | None = None, seed: int = 0):
        """Predict one series: a DataFrame of pred_len rows indexed by y_timestamp
        (with return_samples=True, also an array [sample_count, pred_len, 6] of every path). `key`: the
        series' name, for its own random stream (see predict_batch's `keys`)."""
        frames, samples = self.predict_batch([df], [x_timestamp], [y_timestamp], pred_len, T, top_k, top_p,
                                             sample_count, verbose, return_samples=True, on_progress=on_progress,
                                             keys=None if key is None else [key], seed=seed)
        return (frames[0], samples[0]) if return_samples else frames[0]

    def predict_batch(self, df_list: Sequence[pd.DataFrame], x_timestamp_list: Sequence, y_timestamp_list: Sequence,
                      pred_len: int, T: float = 1.0, top_k: int = 0, top_p: float = 0.9, sample_count: int = 1,
                      verbose: bool = True, return_samples: bool = False, max_batch_size: int | None = None,
                      on_progress: ProgressCallback | None = None, keys: Sequence[str] | None = None, seed: int = 0):
        """Predict many series; they may differ in history length (grouped by length).

        `verbose`: a progress bar of the autoregressive steps (every call's pred_len of them) on stderr, with
        the rate and the time left, as the reference draws one. To follow progress in code, pass `on_progress`:
        it is called with a PredictProgress after every generated step and finished call.
        `keys`: each series' name (e.g. its symbol); with them, series i samples from its own stream keyed by
        (seed, series_key(name, its last x timestamp), path), the same however the series are batched."""
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
        if keys is not None and (isinstance(keys, str) or len(keys) != len(df_list)):
            raise KronosError(f"keys must be a list of one name per series ({len(df_list)}), got {keys!r:.80}")
        params = SamplingParams(temperature=T, top_k=top_k, top_p=top_p)
        prepared = prepare_lists(df_list, x_timestamp_list, y_timestamp_list, pred_len)
        self._warn_long_history(prepared.longest)
        self._mark("prepare")
        per_call = self.series_per_call(max_batch_size, prepared.longest, pred_len, sample_count)
        calls = sum(-(-len(g.members) // per_call) for g in prepared.groups)
        count = len(prepared.indexes)
        means: list[np.ndarray | None] = [None] * count
        samples: list[np.ndarray | None] = [None] * count
        with _progress(on_progress, calls * pred_len, count, verbose) as advance:
            for group in prepared.groups:
                group_keys = None if keys is None else np.array(
                    [series_key(keys[i], int(last)) for i, last in zip(group.members, group.last_ns)], dtype=np.int64)
                mean_paths, all_paths = self.run_group(group.x, group.x_stamp, group.y_stamp, params, sample_count,
                                                  per_call, return_samples,
                                                  on_step=lambda _step: advance(0, 1),
                                                  on_call=lambda done: advance(done, 0), keys=group_keys, seed=seed)
                for position, i in enumerate(group.members):
                    means[i] = mean_paths[position]
                    if all_paths is not None:
                        samples[i] = all_paths[position]
        columns = pd.Index(FEATURE_COLUMNS)  # built once: a list would be re-parsed for every frame
        frames = [pd.DataFrame(values, columns=columns, index=index) for values, index in zip(means, prepared.indexes)]
        return (frames, samples) if return_samples else frames

    def predict_arrays(self, x: np.ndarray | torch.Tensor, x_stamp: np.ndarray | torch.Tensor,
                       y_stamp: np.ndarray | torch.Tensor, T: float = 1.0, top_k: int = 0, top_p: float = 0.9,
                       sample_count: int = 1, verbose: bool = False, max_batch_size: int | None = None,
                       mean_only: bool = False, on_progress: ProgressCallback | None = None,
                       mean_and_samples: bool = False, keys: Sequence[int] | np.ndarray | None = None,
                       seed: int = 0) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Predict N series of one history length from arrays; every sample path, de-normalized.

        x [N, L, 6] raw open, high, low, close, volume, amount; x_stamp [N, L, 5] and y_stamp [N, P, 5]
        calendar features (`kronos_core.data.kline.calendar_features_ns` makes them from timestamps).
        Returns float32 [N, sample_count, P, 6], or with `mean_only` the mean path [N, P, 6] exactly as
        `predict_batch` computes it (mean in normalized space, then de-normalized), or with
        `mean_and_samples` both (mean path, sample paths) from the same run. `keys`: one int per series,
        `streams.series_key(name, last history bar ns)`; with them each series samples from its own stream
        keyed by (seed, key, path), the same however the series are batched (see predict_batch). `verbose`:
        predict_batch's progress bar.
        """
        if x.ndim != 3 or x.shape[2] != len(FEATURE_COLUMNS):
            raise KronosError(f"x must be [N, L, {len(FEATURE_COLUMNS)}], got {list(x.shape)}")
        if tuple(x_stamp.shape) != (*x.shape[:2], 5):
            raise KronosError(f"x_stamp must be [N, L, 5] = {[*x.shape[:2], 5]}, got {list(x_stamp.shape)}")
        if y_stamp.ndim != 3 or y_stamp.shape[0] != x.shape[0] or y_stamp.shape[2] != 5 or y_stamp.shape[1] < 1:
            raise KronosError(f"y_stamp must be [N, P, 5] with N = {x.shape[0]} and P >= 1, got {list(y_stamp.shape)}")
        if sample_count < 1:
            raise KronosError(f"sample_count must be >= 1, got {sample_count}")
        if keys is not None:
            try:
                keys = as_int64_keys(keys, x.shape[0])
            except ValueError as error:
                raise KronosError(str(error)) from None
        values = x if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float32)
        finite = torch.isfinite(values).all().item() if isinstance(values, torch.Tensor) else np.isfinite(values).all()
        if not finite:
            raise KronosError("x holds NaN or inf; fill or drop those rows before predicting")
        if isinstance(x_stamp, np.ndarray):
            x_stamp, y_stamp = x_stamp.astype(np.float32, copy=False), np.asarray(y_stamp, dtype=np.float32)
        pred_len = y_stamp.shape[1]
        self._warn_long_history(x.shape[1])
        params = SamplingParams(temperature=T, top_k=top_k, top_p=top_p)
        per_call = self.series_per_call(max_batch_size, x.shape[1], pred_len, sample_count)
        calls = -(-x.shape[0] // per_call)
        with _progress(on_progress, calls * pred_len, x.shape[0], verbose) as advance:
            mean_path, samples = self.run_group(values, x_stamp, y_stamp, params, sample_count, per_call,
                                           mean_and_samples or not mean_only, on_step=lambda _step: advance(0, 1),
                                           on_call=lambda done: advance(done, 0), keys=keys, seed=seed)
        if mean_and_samples:
            return mean_path, samples
        return mean_path if mean_only else samples

    # Internals ---------------------------------------------------------------------------

    def rows_per_call(self, requested: int | None, history: int, pred_len: int) -> int:
        """Sequences run at once (call_size.rows_per_call): `requested`, else what the device and its free memory
        allow."""
        if requested is not None:
            return rows_per_call(self.device.type, requested)
        window = min(self.max_context, history + pred_len)
        element_bytes = 2 if self.amp else 4
        fit = memory_fit(available_memory_bytes(self.device),
                         bytes_per_sequence(self.model, self.tokenizer, window, element_bytes))
        return rows_per_call(self.device.type, fit=fit, block_rows=cpu_rows_within_blocks(self.model, window))

    def series_per_call(self, requested: int | None, history: int, pred_len: int, sample_count: int) -> int:
        return series_per_call(self.rows_per_call(requested or self.max_batch_size, history, pred_len), sample_count)

    def _warn_long_history(self, longest: int) -> None:
        if longest > self.max_context:
            warnings.warn(f"a history of {longest} rows is longer than max_context={self.max_context}: every row "
                          f"is used for normalization and tokenization, the predictor sees the last "
                          f"{self.max_context} tokens", stacklevel=3)

    @property
    def decode_step(self) -> str:
        """How cached one-token steps run: "graph" (CUDA graphs of fixed-shape steps; the default on CUDA),
        "static" (fixed shapes, eager) or "dynamic" (attention over a view of the filled cache)."""
        graphs = self.device.type == "cuda" if self.cuda_graphs is None else self.cuda_graphs
        if graphs and self.use_cache:
            return "graph"
        return "static" if self.static_cache else "dynamic"

    def mark_phase(self, phase: str) -> None:
        """Report the end of a phase to `phase_clock` (callers that prepare inputs themselves mark "prepare")."""
        self._mark(phase)

    def _mark(self, phase: str) -> None:
        if self.phase_clock is not None:
            self.phase_clock(phase)

    def _autocast(self):
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=AMP_DTYPES[self.amp])

    @torch.inference_mode()
    def run_group(self, x: np.ndarray | torch.Tensor, x_stamp: np.ndarray | torch.Tensor,
                  y_stamp: np.ndarray | torch.Tensor, params: SamplingParams, sample_count: int,
                  series_per_call: int, want_samples: bool,
                  on_step: Callable[[int], None] | None = None,
                  on_call: Callable[[int], None] | None = None, keys: np.ndarray | None = None,
                  seed: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
        """Predict series of one history length (`keys`: int64 [n] series keys, see predict_arrays).

        Returns the mean path [n, P, 6] and, with `want_samples`, every path [n, S, P, 6], both de-normalized
        float32 numpy arrays. Marks "h2d" (copy and normalization), then per call what `generate_call`
        marks, then "d2h" (de-normalization and the copy back).
        """
        device = self.device
        count, pred_len = x.shape[0], y_stamp.shape[1]
        x_norm, mean, std = normalize(x, self.clip, device)
        stamps = torch.cat([to_device(x_stamp, device), to_device(y_stamp, device)], dim=1)
        keys_on_device = None if keys is None else to_device(np.asarray(keys, dtype=np.int64), device)
        self._mark("h2d")
        paths = torch.empty(count, sample_count, pred_len, N_FEATURES, device=device)
        for begin in range(0, count, series_per_call):
            end = min(count, begin + series_per_call)
            call_keys = None if keys_on_device is None else keys_on_device[begin:end]
            paths[begin:end] = self.generate_call(x_norm[begin:end], stamps[begin:end], pred_len, params,
                                                   sample_count, on_step, keys=call_keys, seed=seed)
            if on_call is not None:
                on_call(end - begin)
        scale = std + NORM_EPS  # [n, 1, 6]
        mean_path = paths.mean(dim=1) * scale + mean
        samples = paths * scale[:, None] + mean[:, None] if want_samples else None
        mean_host = to_host(mean_path)
        samples_host = to_host(samples) if samples is not None else None
        self._mark("d2h")
        return mean_host, samples_host

    @torch.inference_mode()
    def generate_call(self, x_norm: torch.Tensor, stamps: torch.Tensor, pred_len: int, params: SamplingParams,
                       sample_count: int, on_step: Callable[[int], None] | None = None,
                       keys: torch.Tensor | None = None, seed: int = 0) -> torch.Tensor:
        """Normalized sample paths [n, sample_count, pred_len, 6] (float32, on the device) of n series.

        x_norm [n, L, 6] normalized history and stamps [n, L + pred_len, 5], both on the device; `keys` int64
        [n] series keys (each row then samples from its own stream, and the call is padded to whole row
        blocks so its arithmetic does not depend on the batch: streams.pad_rows), or None (torch's global
        generator, no padding). Marks "encode", "step" after each generated step, then "decode"."""
        count = x_norm.shape[0]
        x = torch.clamp(x_norm.to(self.device), -self.clip, self.clip)
        stamps = stamps.to(self.device)
        if keys is not None:
            x, stamps, keys = (pad_rows(t) for t in (x, stamps, keys.to(self.device)))

        def stepped(step: int) -> None:
            if on_step is not None:
                on_step(step)
            self._mark("step")

        with self._autocast():
            s1, s2 = self.tokenizer.encode(x, half=True)
            self._mark("encode")
            if sample_count > 1:
                s1, s2 = s1.repeat_interleave(sample_count, 0), s2.repeat_interleave(sample_count, 0)
                stamps = stamps.repeat_interleave(sample_count, 0)
            cache_dtype = AMP_DTYPES[self.amp] if self.amp else None
            streams = None if keys is None else RowStreams(seed, keys, sample_count)
            new_s1, new_s2 = generate_tokens(self.model, s1, s2, stamps, pred_len, self.max_context, params,
                                             use_cache=self.use_cache, window_mode=self.window_mode,
                                             cache_dtype=cache_dtype, on_step=stepped,
                                             decode_step=self.decode_step, streams=streams)
            if self.token_sink is not None:
                self.token_sink(new_s1[:count * sample_count], new_s2[:count * sample_count])
            total = s1.shape[1] + pred_len
            start = max(0, total - self.max_context)
            full_s1 = torch.cat([s1, new_s1], dim=1)[:, start:]
            full_s2 = torch.cat([s2, new_s2], dim=1)[:, start:]
            decoded = self.tokenizer.decode([full_s1, full_s2], half=True, last=pred_len)
        paths = decoded[:count * sample_count].float().reshape(count, sample_count, pred_len, -1)
        self._mark("decode")
        return paths
