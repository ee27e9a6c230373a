"""Peak memory against batch size, and the largest batch that fits: one model and one search for autobatch,
the planner and the maximizer.

``PeakModel`` is the highest of its series at every batch size. Its series come either from measured probes
(``PeakModel.fit``: per phase and overall, a least-squares line and the chord through the points) or from one
fake step traced at a marker batch size (``PeakModel.from_marker``: one line per point of the step, exact).
``largest_fitting`` is the search both use: from a guess (a size, or autobatch's fit asked before every probe),
gallop to a bracket, then bisect. The margin a pick keeps free (``default_margin``) is what the meter cannot see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kronos_tune.errors import KronosTuneError

if TYPE_CHECKING:
    import torch

TOTAL_SERIES = "total"
_CURVATURE_TOLERANCE = 0.01  # max |residual| of the line, as a fraction of the peak range
CPU_MARGIN = 0.05
CUDA_MARGIN = 0.10


def default_margin(device: str | torch.device | None, estimate: bool = False, cuda_emulation: Any = None) -> float:
    """The budget fraction kept free when the caller gives none.

    The margin covers what the meter does not see. The exact CPU meter of a
    simulated device misses only scratch buffers inside kernels, so 5%. On CUDA
    (real, or emulated by an estimate) the caching allocator's fragmentation and
    library workspaces are unseen, so 10%.
    """
    import torch  # here only: checking a margin or fitting probes needs none (autobatch's bad-flag errors)

    on_cuda = (estimate and cuda_emulation is not None) or (device is not None and torch.device(device).type == "cuda")
    return CUDA_MARGIN if on_cuda else CPU_MARGIN


def validate_margin(margin: Any) -> float:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0.0 <= float(margin) < 1.0:
        raise KronosTuneError(f"margin must be >= 0 and < 1 (a fraction of the budget kept free), got {margin!r}")
    return float(margin)


NextSize = Callable[[int | None, int | None], int | None]


def largest_fitting(fits: Callable[[int], bool], low: int, high: int,
                    guess: int | NextSize | None = None) -> int | None:
    """The largest size in low..high that ``fits``, None when not even ``low`` does. Assumes memory grows with
    the batch size.

    From ``guess`` (default ``low``) it gallops to a bracket (steps of 1, 2, 4, ... up while sizes fit, down
    while they do not; past an end it tries the end itself), then bisects; the answer ``b`` is checked by a call
    at ``b`` that fit and one at ``b + 1`` that did not (unless ``b`` is ``high``).

    ``guess`` may instead be a function of what is known, asked before every call: ``guess(fit, failed)``, the
    largest size seen to fit and the smallest seen not to (None before any), gives the size to try next (a
    measured model's pick: autobatch). A size strictly between the two replaces the gallop's or the
    bisection's step; ``fit`` itself ends the search there, the call at ``fit + 1`` saved (the model says it
    would not fit); None or any other size leaves the step to the gallop or the bisection."""
    if high < low:
        return None
    ask = guess if callable(guess) else None
    start = low if guess is None or ask is not None else max(low, min(guess, high))
    fit: int | None = None
    failed: int | None = None
    step = 1
    while True:
        if fit is not None and (fit == high or failed == fit + 1):
            return fit
        if failed == low:
            return None
        if fit is None and failed is None:
            size, galloping = start, False
        elif failed is None:
            size, galloping = min(fit + step, high), True  # a gallop past the top tries `high` itself
        elif fit is None:
            size, galloping = max(failed - step, low), True  # and past the bottom `low`
        else:
            size, galloping = (fit + failed) // 2, False
        if ask is not None:
            proposed = ask(fit, failed)
            if fit is not None and proposed == fit:
                return fit
            above, below = low - 1 if fit is None else fit, high + 1 if failed is None else failed
            if proposed is not None and above < proposed < below:
                size, galloping = proposed, False
        if fits(size):
            fit = size
        else:
            failed = size
        if galloping:  # 1, 2, 4, ...; once both ends are known the bisection takes over
            step *= 2


@dataclass(frozen=True)
class SeriesFit:
    """Peak bytes of one series against batch size: a line, and the chord through the measured points where
    there are any (a marker trace's lines have none)."""

    name: str
    batch_sizes: tuple[int, ...]
    peak_bytes: tuple[int, ...]
    fixed_bytes: float
    bytes_per_sample: float
    max_residual_bytes: float

    @classmethod
    def fit(cls, name: str, points: list[tuple[int, int]]) -> SeriesFit:
        points = sorted(points)
        xs = np.array([p[0] for p in points], dtype=np.float64)
        ys = np.array([p[1] for p in points], dtype=np.float64)
        if len(points) == 1:
            return cls(name, (int(xs[0]),), (int(ys[0]),), float(ys[0]), 0.0, 0.0)
        design = np.stack([np.ones_like(xs), xs], axis=1)
        (intercept, slope), *_ = np.linalg.lstsq(design, ys, rcond=None)
        residual = float(np.max(np.abs(ys - (intercept + slope * xs))))
        return cls(name, tuple(int(x) for x in xs), tuple(int(y) for y in ys), float(intercept), float(slope),
                   residual)

    @classmethod
    def line(cls, name: str, fixed_bytes: float, bytes_per_sample: float) -> SeriesFit:
        return cls(name, (), (), float(fixed_bytes), float(bytes_per_sample), 0.0)

    @property
    def curved(self) -> bool:
        span = max(self.peak_bytes, default=0) - min(self.peak_bytes, default=0)
        return len(self.batch_sizes) >= 3 and span > 0 and self.max_residual_bytes > _CURVATURE_TOLERANCE * span

    def predict(self, batch_sizes: np.ndarray) -> np.ndarray:
        b = batch_sizes.astype(np.float64)
        linear = self.fixed_bytes + max(self.bytes_per_sample, 0.0) * b
        if not self.batch_sizes:
            return linear
        xs = np.array(self.batch_sizes, dtype=np.float64)
        ys = np.array(self.peak_bytes, dtype=np.float64)
        if len(xs) == 1:
            return np.maximum(linear, ys[0])
        chord = np.interp(b, xs, ys)
        secant = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
        above = b > xs[-1]
        chord[above] = ys[-1] + secant * (b[above] - xs[-1])
        return np.maximum(linear, chord)


@dataclass(frozen=True)
class PeakModel:
    """Peak bytes at any batch size: the highest of the series there."""

    series: tuple[SeriesFit, ...]

    @classmethod
    def fit(cls, probes: Sequence[Any]) -> PeakModel | None:
        """From measured probes (each with ``fits``, ``batch_size``, ``peak_bytes`` and ``phase_peak_bytes``):
        the overall peak's series and one per phase every probe reported; None below two batch sizes."""
        by_size: dict[int, Any] = {}
        for probe in probes:  # a size measured twice: keep the higher peak
            if not probe.fits or probe.peak_bytes is None:
                continue
            if probe.batch_size not in by_size or probe.peak_bytes > (by_size[probe.batch_size].peak_bytes or 0):
                by_size[probe.batch_size] = probe
        if len(by_size) < 2:
            return None
        chosen = list(by_size.values())
        series = [SeriesFit.fit(TOTAL_SERIES, [(p.batch_size, int(p.peak_bytes or 0)) for p in chosen])]
        common = set.intersection(*(set(p.phase_peak_bytes) for p in chosen))
        for name in sorted(common):
            series.append(SeriesFit.fit(name, [(p.batch_size, p.phase_peak_bytes[name]) for p in chosen]))
        return cls(tuple(series))

    @classmethod
    def from_marker(cls, marker: int, live_bytes: Sequence[int], scaled_bytes: Sequence[int],
                    scaled_counted_bytes: Sequence[int]) -> PeakModel:
        """From one step traced at the ``marker`` batch size: the live bytes after every allocation, of them
        the bytes of the storages that scale with the batch, exact and as counted (rounded).

        At every point of the step the live bytes are affine in the batch size: the storages that scale with
        it count in proportion, the others as they are (up to the allocator's block rounding of the scaled
        storages at another batch size, which the lines leave out). So the peak at batch B is the highest of
        those lines at B, which follows the peak from one point of the step to another (the optimizer's
        temporaries at small batches, the activations at large ones) where a line through two peaks would
        not. Only the lines no other one is above at every batch size >= 0 are kept."""
        lines = {(scaled / marker, live - counted)
                 for live, scaled, counted in zip(live_bytes, scaled_bytes, scaled_counted_bytes)}
        kept: list[tuple[float, float]] = []
        for slope, fixed in sorted(lines, reverse=True):
            if not kept or fixed > kept[-1][1]:
                kept.append((slope, fixed))
        return cls(tuple(SeriesFit.line(f"point {i}", fixed, slope) for i, (slope, fixed) in enumerate(kept)))

    def predict(self, batch_sizes: np.ndarray) -> np.ndarray:
        return np.max(np.stack([s.predict(batch_sizes) for s in self.series]), axis=0)

    def peak_at(self, batch_size: int) -> int:
        return round(float(self.predict(np.array([batch_size]))[0]))

    def governing(self, batch_size: int) -> SeriesFit:
        values = [float(s.predict(np.array([batch_size]))[0]) for s in self.series]
        return self.series[int(np.argmax(values))]

    def fits(self, batch_size: int, usable_bytes: float) -> bool:
        return float(self.predict(np.array([batch_size]))[0]) <= usable_bytes

    def largest_fitting(self, usable_bytes: float, low: int, high: int) -> int | None:
        """The largest batch in [low, high] predicted within ``usable_bytes`` (None: not even ``low``), searched
        from where the first series' line crosses it."""
        first = self.series[0]
        guess = low if first.bytes_per_sample <= 0 else int(
            min(max((usable_bytes - first.fixed_bytes) / first.bytes_per_sample, low), high))
        return largest_fitting(lambda batch: self.fits(batch, usable_bytes), low, high, guess)

    def to_json(self) -> list[list[float]]:
        """The lines (a marker model's: what it is made of), for the planner's trace cache."""
        return [[s.fixed_bytes, s.bytes_per_sample] for s in self.series]

    @classmethod
    def lines_from_json(cls, data: Any) -> PeakModel:
        return cls(tuple(SeriesFit.line(f"point {i}", float(fixed), float(slope))
                         for i, (fixed, slope) in enumerate(data)))
