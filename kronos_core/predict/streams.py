"""Per-series random streams: one forecast per series, however the batch, chunk or rank that computes it.

With today's global generator, the numbers a row draws depend on every row
drawn before it (the batch, its order, the chunk size, the rank), so a series'
sampled forecast changes with how it was computed. Here every row (series i,
sample path j) draws from a stream of its own, keyed by

- the run's `seed`,
- the series' key: `series_key(name, last_ns)`, a hash of its name and the
  timestamp of its last history bar (tomorrow's run, or another backtest
  origin, draws fresh numbers; other symbols in the run change nothing),
- the path index j, and a draw counter (two draws per generated bar: s1, s2).

The stream is counter-based: draw n of a row is the splitmix64 finalizer of
(row state + n * a constant), computed with int64 tensor ops on the device for
all rows at once (no per-row Python loop, no torch.Generator per row). The
counter lives in a device tensor advanced in place, so a step captured as a
CUDA graph keeps drawing fresh numbers on replay, with no host sync.

int64 tensors hold the hash's unsigned 64-bit words bit for bit: multiplication
wraps modulo 2**64 and right shifts are made logical with a mask (torch's `>>`
on int64 is arithmetic). `tests/test_predict_streams.py` checks the tensor hash
against a pure-Python one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

# Names how sampled draws are made; a run that keeps results across invocations (a resumed backtest or job)
# records it and refuses to continue one made with other draws. Change it whenever the same key would draw
# other numbers.
DRAWS = "series-streams-1"
KEY_BITS = 63
_WORD = 1 << 64
_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: the splitmix64 increment
_PATH_STRIDE = 0xD1B54A32D192ED03
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_UNIFORM_BITS = 24  # float32 holds every multiple of 2**-24 in [0, 1) exactly
# CPU matrix products (MKL sgemm, AVX2) compute a row the same way in any batch when the batch's rows are a
# multiple of 4; with 1-3 rows (and, with several threads, a few more: 5-7, 9-11, ...) tail rows take other
# kernels and round differently. Keyed calls are padded to a multiple of ROW_BLOCK rows (benchmarks/
# predict_streams.py measures the effect; docs/prediction.md says what was found).
ROW_BLOCK = 4


def series_key(name: str, last_ns: int) -> int:
    """A stable 63-bit non-negative int from the series' name and the timestamp (ns since epoch, int) of its last
    history bar; the same on every machine, process and Python (blake2b, never the salted `hash()`)."""
    digest = hashlib.blake2b(str(name).encode("utf-8"), digest_size=8, person=b"kronos-series",
                             salt=int(last_ns).to_bytes(8, "little", signed=True))
    return int.from_bytes(digest.digest(), "little") >> (64 - KEY_BITS)


def as_int64_keys(keys: Sequence[int] | np.ndarray, count: int, what: str = "keys") -> np.ndarray:
    """`keys` as an int64 array of `count` entries (ints wrap modulo 2**64, so any int of series_key fits)."""
    if isinstance(keys, np.ndarray) and keys.dtype == np.int64:
        array = keys.reshape(-1)
    else:
        try:
            array = np.asarray([_signed(int(k)) for k in keys], dtype=np.int64)
        except (TypeError, ValueError):
            raise ValueError(f"{what} must be integers (series_key of each series' name and last bar)") from None
    if len(array) != count:
        raise ValueError(f"got {len(array)} {what} for {count} series; pass one per series")
    return array


def _signed(word: int) -> int:
    word %= _WORD
    return word - _WORD if word >= _WORD // 2 else word


def _shift_right(x: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 words (torch's `>>` sign-extends)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: Tensor) -> Tensor:
    """The splitmix64 finalizer of int64 words, elementwise (a bijection with full avalanche)."""
    x = (x ^ _shift_right(x, 30)) * _signed(_MIX1)
    x = (x ^ _shift_right(x, 27)) * _signed(_MIX2)
    return x ^ _shift_right(x, 31)


def mix64_int(word: int) -> int:
    """mix64 of one Python int (the reference the tensor version is checked against; seeds are mixed here)."""
    word %= _WORD
    word = ((word ^ (word >> 30)) * _MIX1) % _WORD
    word = ((word ^ (word >> 27)) * _MIX2) % _WORD
    return word ^ (word >> 31)


class RowStreams:
    """The streams of the rows of one predict call: row r = series r // paths, path r % paths (repeat_interleave order,
    as generate_call lays out sample paths). `uniforms()` gives one float32 in [0, 1) per row and advances every
    row's counter by one, in place on the device."""

    def __init__(self, seed: int, keys: Tensor, paths: int):
        device = keys.device
        seed_word = _signed(mix64_int(_signed(seed) + _GOLDEN))
        series = mix64(keys.to(torch.int64) ^ seed_word)
        path = torch.arange(paths, dtype=torch.int64, device=device) + 1
        self.rows = mix64(series.repeat_interleave(paths) + path.repeat(len(keys)) * _signed(_PATH_STRIDE))
        self.counter = torch.zeros((), dtype=torch.int64, device=device)

    def uniforms(self) -> Tensor:
        words = mix64(self.rows + self.counter * _signed(_GOLDEN))
        self.counter.add_(1)
        return _shift_right(words, 64 - _UNIFORM_BITS).to(torch.float32) * (2.0 ** -_UNIFORM_BITS)


def pad_rows(tensor: Tensor, block: int = ROW_BLOCK) -> Tensor:
    """`tensor` with copies of its last row appended up to a multiple of `block` rows (dimension 0)."""
    missing = -tensor.shape[0] % block
    if missing == 0:
        return tensor
    return torch.cat([tensor, tensor[-1:].expand(missing, *tensor.shape[1:])])


def sample_inverse_cdf(probs: Tensor, uniforms: Tensor) -> Tensor:
    """One token id per row of `probs` [B, V] (rows sum to about 1, zeros where masked) for `uniforms` [B] in
    [0, 1): the first token whose cumulative probability passes u times the row's total. A u that rounds onto
    the total takes the row's last token of non-zero probability, so a masked token is never drawn."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:].contiguous()
    drawn = torch.searchsorted(cdf, uniforms.unsqueeze(-1) * total, right=True)
    last_kept = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(drawn, last_kept).squeeze(-1)
