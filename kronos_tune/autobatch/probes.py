"""Probes and results of the autobatch search (the peak model it fits: kronos_tune.memory.peak), and a result in
plain words: a probe's progress line and the TOML snippet of the pick (the Rich tables and plot are the commands
layer's, commands/autobatch_render.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

import torch

from kronos_core.units import format_bytes
from kronos_tune.memory.estimate import accepts_meter

ProbeStatus = Literal["ok", "oom", "verify"]
ProbeKind = Literal["probe", "verify", "diagnose"]
StepFactory = Callable[[int], Callable[..., Any]]

_EXTRAPOLATION_FACTOR = 2.0
_BACKOFF_FACTOR = 0.9


def _call(fn: Callable[..., Any], meter: Any) -> Any:
    return fn(meter=meter) if accepts_meter(fn) else fn()


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


def within(probe: Probe, usable_bytes: int) -> bool:
    """Whether a probe ran within ``usable_bytes`` (CUDA: its reserved peak too)."""
    if not probe.fits or (probe.peak_bytes or 0) > usable_bytes:
        return False
    return probe.reserved_peak_bytes is None or probe.reserved_peak_bytes <= usable_bytes


def largest_within(probes: list[Probe], usable_bytes: int) -> Probe | None:
    """The probe of the largest batch measured within ``usable_bytes`` (a verification first among equals)."""
    good = [p for p in probes if within(p, usable_bytes)]
    return max(good, key=lambda p: (p.batch_size, p.kind == "verify")) if good else None


def probe_line(probe: Probe, unit: str = "batch") -> str:
    """One line per finished probe, for progress output."""
    peak = format_bytes(probe.peak_bytes) if probe.peak_bytes is not None else "out of memory"
    return f"{probe.kind} {unit} {probe.batch_size}: {peak} ({probe.status}, {probe.wall_time_s:.1f} s)"


def toml_snippet(batch_size: int, accumulation_steps: int) -> str:
    return f"batch_size = {batch_size}\naccumulation_steps = {accumulation_steps}\n"


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

    @property
    def largest_measured_fit(self) -> int | None:
        """The largest batch a real run showed within the usable budget (None: none did)."""
        found = largest_within(self.probes, self.usable_bytes)
        return found.batch_size if found is not None else None

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


# ---------------------------------------------------------------------------- runners


class SearchCancelled(Exception):
    """Raised by an `on_probe` callback to stop a search between probes (the dashboard's stop, a benchmark's
    cancel); the search itself does not catch it."""
