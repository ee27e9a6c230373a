"""Probes, results and the peak-memory fit of the autobatch search."""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import torch


ProbeStatus = Literal["ok", "oom", "verify"]
ProbeKind = Literal["probe", "verify", "diagnose"]
StepFactory = Callable[[int], Callable[..., Any]]

TOTAL_SERIES = "total"
_EXTRAPOLATION_FACTOR = 2.0
_BACKOFF_FACTOR = 0.9
_CURVATURE_TOLERANCE = 0.01  # max |residual| of the line, as a fraction of the peak range


def _accepts_meter(fn: Callable[..., Any]) -> bool:
    try:
        return "meter" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _call(fn: Callable[..., Any], meter: Any) -> Any:
    return fn(meter=meter) if _accepts_meter(fn) else fn()


class OnProbe(Protocol):
    def __call__(self, probe: Probe) -> None: ...


@dataclass
class Probe:
    """One measured build + steps (+ eval) at ``batch_size``.

    ``status``: ``ok`` it ran within ``cap_bytes``; ``oom`` it ran out of
    memory (on a verification: more than the usable budget); ``verify`` this
    run verified the pick. ``peak_bytes`` is None after an out-of-memory.
    """

    batch_size: int
    peak_bytes: int | None
    status: ProbeStatus
    kind: ProbeKind = "probe"
    cap_bytes: int = 0
    phase_peak_bytes: dict[str, int] = field(default_factory=dict)
    reserved_peak_bytes: int | None = None  # CUDA only: the caching allocator's reserved peak
    build_bytes: int | None = None  # live bytes the factory left before the first step
    steps_run: int = 0
    step_time_s: float | None = None  # wall time of the last training step (under the meter)
    wall_time_s: float = 0.0  # build, steps, eval and clean-up
    leaked_bytes: int = 0  # live bytes still counted after clean-up
    error: str | None = None  # first line of the out-of-memory message

    @property
    def fits(self) -> bool:
        return self.status != "oom" and self.peak_bytes is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AutobatchResult:
    """The pick and everything measured on the way (bytes, seconds)."""

    batch_size: int
    accumulation_steps: int
    budget_bytes: int
    usable_bytes: int
    margin: float
    fixed_bytes: int
    bytes_per_sample: float
    predicted_peak_bytes: int
    measured_peak_bytes: int
    probes: list[Probe]
    headroom_bytes: int
    search_time_s: float
    step_time_s: float | None
    notes: list[str]
    max_fit_batch_size: int  # the memory pick before the accumulation adjustment
    effective_batch: int | None
    device: str
    estimate: bool
    governing_series: str  # the phase (or "total") whose line sets the prediction at the pick
    fit_lines: dict[str, tuple[float, float]]  # series -> (fixed_bytes, bytes_per_sample), least squares
    curve: list[tuple[int, int]]  # (batch size, predicted peak bytes), for plots
    probe_steps: int  # training steps run (or traced) by all probes together
    leftover_bytes: int  # bytes still counted by the meter after the search (0 = everything freed)

    @property
    def search_probes(self) -> int:
        return sum(1 for p in self.probes if p.kind == "probe")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fit_lines"] = {k: list(v) for k, v in self.fit_lines.items()}
        out["curve"] = [list(point) for point in self.curve]
        out["search_probes"] = self.search_probes
        return out


@dataclass
class ProbeStep:
    """What ``step_factory(B)`` may return instead of a bare callable.

    ``run`` is one training step (it may take ``meter``); ``model`` and
    ``optimizer`` are needed by ``estimate=True``; ``on_close`` releases what
    the step holds once its probe is done. ``prime``, where given, creates
    what the first step would create and keep (optimizer state, tables built
    at the first forward) without running one, so that the next step is a
    steady-state one.
    """

    run: Callable[..., Any]
    model: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    on_close: Callable[[], None] | None = None
    prime: Callable[[], None] | None = None

    def __call__(self, meter: Any = None) -> Any:
        return _call(self.run, meter)

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()
        self.run = _closed
        self.model = self.optimizer = None


def _closed(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("this ProbeStep was closed")


# ---------------------------------------------------------------------------- fitting
@dataclass(frozen=True)
class SeriesFit:
    """Peak bytes of one series (a phase, or the overall peak) against batch size."""

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

    @property
    def curved(self) -> bool:
        span = max(self.peak_bytes) - min(self.peak_bytes)
        return len(self.batch_sizes) >= 3 and span > 0 and self.max_residual_bytes > _CURVATURE_TOLERANCE * span

    def predict(self, batch_sizes: np.ndarray) -> np.ndarray:
        b = batch_sizes.astype(np.float64)
        xs = np.array(self.batch_sizes, dtype=np.float64)
        ys = np.array(self.peak_bytes, dtype=np.float64)
        linear = self.fixed_bytes + max(self.bytes_per_sample, 0.0) * b
        if len(xs) == 1:
            return np.maximum(linear, ys[0])
        chord = np.interp(b, xs, ys)
        secant = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
        above = b > xs[-1]
        chord[above] = ys[-1] + secant * (b[above] - xs[-1])
        return np.maximum(linear, chord)


@dataclass(frozen=True)
class PeakModel:
    """Prediction = max over the series fits (each phase's line and the overall peak)."""

    series: tuple[SeriesFit, ...]

    @classmethod
    def fit(cls, probes: list[Probe]) -> PeakModel | None:
        fitted = [p for p in probes if p.fits and p.peak_bytes is not None]
        by_size: dict[int, Probe] = {}
        for probe in fitted:  # a size measured twice: keep the higher peak
            if probe.batch_size not in by_size or (probe.peak_bytes or 0) > (by_size[probe.batch_size].peak_bytes or 0):
                by_size[probe.batch_size] = probe
        if len(by_size) < 2:
            return None
        chosen = list(by_size.values())
        series = [SeriesFit.fit(TOTAL_SERIES, [(p.batch_size, int(p.peak_bytes or 0)) for p in chosen])]
        common = set.intersection(*(set(p.phase_peak_bytes) for p in chosen))
        for name in sorted(common):
            series.append(SeriesFit.fit(name, [(p.batch_size, p.phase_peak_bytes[name]) for p in chosen]))
        return cls(tuple(series))

    def predict(self, batch_sizes: np.ndarray) -> np.ndarray:
        return np.max(np.stack([s.predict(batch_sizes) for s in self.series]), axis=0)

    def predict_one(self, batch_size: int) -> int:
        return int(math.ceil(float(self.predict(np.array([batch_size]))[0])))

    def governing(self, batch_size: int) -> SeriesFit:
        values = [float(s.predict(np.array([batch_size]))[0]) for s in self.series]
        return self.series[int(np.argmax(values))]

    def largest_fitting(self, usable_bytes: int, low: int, high: int) -> int | None:
        """Largest B in [low, high] with every prediction from low to B within usable_bytes."""
        if high < low:
            return None
        sizes = np.arange(low, high + 1)
        fits = self.predict(sizes) <= usable_bytes
        if not fits[0]:
            return None
        if fits.all():
            return high
        return int(sizes[int(np.argmin(fits)) - 1])


# ---------------------------------------------------------------------------- runners


class SearchCancelled(Exception):
    """Raised by an `on_probe` callback to stop a search between probes (the dashboard's stop, a benchmark's
    cancel); the search itself does not catch it."""
