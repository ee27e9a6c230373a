"""The generic search: the largest batch whose real training step fits a memory budget.

``autobatch(step_factory, budget_bytes)`` measures a few batch sizes with the
real step and picks from a fit, instead of doubling until something breaks:

1. **Probe.** ``step_factory(B)`` builds everything a training run at batch
   ``B`` needs (model, optimizer, data) and returns a callable that runs one
   optimizer step. A probe builds it fresh, runs ``steps_per_probe`` steps (the
   first with a fresh optimizer, whose AdamW state appears lazily inside
   ``step()``; the second with that state alive) and, with an
   ``eval_factory``, one evaluation batch, all under a meter: on CPU a
   ``CpuExactMeter`` whose budget *is* the simulated device (going over raises
   ``torch.OutOfMemoryError`` like CUDA would), on CUDA a ``CudaMeter`` with
   the caching allocator capped at the budget when the card is bigger, and
   with ``estimate=True`` ``estimate_step_peak`` on fake tensors (nothing is
   allocated). The probe's peak is the highest live-bytes count over all of
   it, overall and per phase (data/forward/backward/optimizer/eval) when the
   step reports phases to the meter. Everything is dropped after each probe
   (``close()``, ``gc.collect()``, ``torch.cuda.empty_cache()``) and the bytes
   left over are checked.
2. **Fit.** Per phase and overall, peak = fixed + per_sample x B by least
   squares. A phase's peak is linear in B, but the overall peak is a maximum
   of phases (at batch 1 the optimizer step can dominate, at batch 64 the
   backward pass), so the prediction is the maximum over the phase lines, and
   over a chord model through the measured points (piecewise linear; above
   the largest probe it continues the last secant): whichever is higher. That
   is exact for piecewise-linear peaks, conservative for convex ones inside
   the probed range, and never below a measured point.
3. **Pick** the largest B whose prediction is <= budget x (1 - margin), below
   every size known not to fit. A pick more than 2x the largest probe is an
   extrapolation: it is probed first (or, when the fit was already wrong about
   a size that ran out of memory, the geometric middle of the bracket is), at
   most ``max_probes`` search probes in all. The runs are the calls of
   ``largest_fitting`` (kronos_tune/memory/peak.py, the planner's search too),
   each size guessed from the fit of the runs before it.
4. **Verify** the pick (its micro-batch after the accumulation adjustment) with
   a fresh build under a cap of budget x (1 - margin): first optimizer step,
   the next step and an eval batch. A probe already run at that size under that
   much memory counts. It fitting ends the search (no run at the size above
   it); on out-of-memory the search backs off to min(refit, 0.9 x B) and
   verifies again, never below the largest size already seen to fit.

Known failure modes of the usual tools, and what is done about them here:
doubling until OOM (Lightning's power scaling) pays one OOM per try and
fragments the allocator: OOMs here only come from a wrong fit; profiling only
forward+backward or the first step (Ultralytics' autobatch) misses AdamW
state and the eval pass: probes run the full step twice plus eval; a
straight-line extrapolation far past the probes (Ultralytics' polyfit to 60%
of free memory) is not trusted beyond 2x; halving on OOM (accelerate's
``find_executable_batch_size`` before 0.9) loses up to half the batch: back
off is 0.9x or the refit; a smaller batch without more accumulation changes
the optimization (the global batch): ``effective_batch`` keeps it.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from kronos_core.units import format_bytes
from kronos_tune.errors import KronosTuneError
from kronos_tune.memory.estimate import CudaEmulation

from kronos_tune.autobatch.probes import (
    _BACKOFF_FACTOR, _EXTRAPOLATION_FACTOR, AutobatchResult, OnProbe, Probe, ProbeKind, StepFactory, largest_within,
    within,
)
from kronos_tune.memory.peak import TOTAL_SERIES, PeakModel, default_margin, largest_fitting, validate_margin
from kronos_tune.autobatch.runners import _CpuRunner, _CudaRunner, _EstimateRunner, _Runner


def split_effective_batch(max_batch_size: int, effective_batch: int) -> tuple[int, int, str]:
    """(batch_size, accumulation_steps, what was done) for a memory limit and a global batch to keep.

    accumulation = ceil(effective / max); the batch then shrinks to the largest
    size <= max that divides the effective batch with at most twice that many
    micro-steps, else to ceil(effective / accumulation) (product within one
    micro-batch of the target, said in the note).
    """
    if max_batch_size >= effective_batch:
        return effective_batch, 1, f"effective batch {effective_batch} fits in one micro-batch"
    accumulation = math.ceil(effective_batch / max_batch_size)
    for steps in range(accumulation, 2 * accumulation + 1):
        if effective_batch % steps == 0 and effective_batch // steps <= max_batch_size:
            batch = effective_batch // steps
            how = "" if batch == max_batch_size else f", batch reduced from {max_batch_size}"
            return batch, steps, (f"{batch} x {steps} accumulation steps = effective batch {effective_batch} "
                                  f"exactly{how}")
    batch = math.ceil(effective_batch / accumulation)
    return batch, accumulation, (f"effective batch {effective_batch} has no divisor <= {max_batch_size} within "
                                 f"{2 * accumulation} micro-steps; using {batch} x {accumulation} = "
                                 f"{batch * accumulation} per optimizer step")


def _checked_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise KronosTuneError(f"autobatch: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _make_runner(step_factory: StepFactory, eval_factory: StepFactory | None, device: str | torch.device | None,
                 estimate: bool, steps_per_probe: int, cuda_emulation: CudaEmulation | None,
                 round_bytes: int) -> _Runner:
    if estimate:
        return _EstimateRunner(step_factory, eval_factory, steps_per_probe, cuda_emulation)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise KronosTuneError("autobatch: device cuda requested but no CUDA device is visible; use device='cpu' "
                                  "(simulated budget) or estimate=True")
        return _CudaRunner(step_factory, eval_factory, steps_per_probe, dev)
    if dev.type != "cpu":
        raise KronosTuneError(f"autobatch: device {dev} is not supported; use cpu or cuda")
    return _CpuRunner(step_factory, eval_factory, steps_per_probe, round_bytes)


# ---------------------------------------------------------------------------- the search
class _Search:
    def __init__(self, runner: _Runner, budget_bytes: int, usable_bytes: int, min_batch: int, max_batch: int,
                 max_probes: int, max_verify: int, effective_batch: int | None, on_probe: OnProbe | None) -> None:
        self.runner = runner
        self.budget_bytes = budget_bytes
        self.usable_bytes = usable_bytes
        self.min_batch = min_batch
        self.max_batch = max_batch
        self.max_probes = max_probes
        self.max_verify = max_verify
        self.effective_batch = effective_batch
        self.on_probe = on_probe
        self.probes: list[Probe] = []
        self.notes: list[str] = []
        self.pick: int | None = None  # the fit's last pick
        self.trusted: int | None = None  # its micro-batch, run as its verification

    # bookkeeping -------------------------------------------------------------------
    def probe(self, batch_size: int, kind: ProbeKind = "probe") -> Probe:
        cap = self.usable_bytes if kind == "verify" else self.budget_bytes
        result = self.runner.run(batch_size, cap, kind)
        self.probes.append(result)
        if self.on_probe is not None:
            self.on_probe(result)
        if result.leaked_bytes > 0:
            self.notes.append(f"probe at {batch_size} left {format_bytes(result.leaked_bytes)} allocated after "
                              "clean-up (later probes read that much higher)")
        return result

    @property
    def search_probes(self) -> int:
        return sum(1 for p in self.probes if p.kind == "probe")

    @property
    def verify_runs(self) -> int:
        return sum(1 for p in self.probes if p.kind == "verify")

    def measured(self) -> list[Probe]:
        return [p for p in self.probes if p.fits]

    def within_usable(self, probe: Probe) -> bool:
        return within(probe, self.usable_bytes)

    def known_good(self) -> Probe | None:
        """Largest size measured within the usable budget (each probe ran a fresh optimizer and the eval)."""
        return largest_within(self.probes, self.usable_bytes)

    def fitted_pick(self, model: PeakModel | None, failed: int | None) -> int | None:
        if model is None:
            return None
        upper = self.max_batch if failed is None else min(self.max_batch, failed - 1)
        return model.largest_fitting(self.usable_bytes, self.min_batch, upper)

    # the search -------------------------------------------------------------------
    def search(self) -> int:
        """The memory pick: ``largest_fitting`` over real runs, each next size guessed from the fit of the runs so
        far (``next_size``). A pick within 2x of a measured size is trusted: its micro-batch runs once, under the
        usable cap, as its verification, and no run at the size above it is needed."""

        def runs_within(batch_size: int) -> bool:
            return self.within_usable(self.probe(batch_size, "verify" if batch_size == self.trusted else "probe"))

        found = largest_fitting(runs_within, self.min_batch, self.max_batch, self.next_size)
        if found is None:
            raise _FixedCostTooBig(self.probes[0])
        trusted = self.pick is not None and _split(self.pick, self.effective_batch)[0] <= found  # not one that failed
        return self.pick if trusted else found

    def next_size(self, fit: int | None, failed: int | None) -> int | None:
        """The size to run next, for ``largest_fitting``: `fit` (the largest size run within the usable budget) to
        stop there; `failed`: the smallest run that was not."""
        if fit is None:
            return self.min_batch
        if fit == self.trusted:
            return fit  # the pick's verification ran within the usable cap
        if failed is not None and failed == self.trusted:
            return self._back_off(fit, failed)
        model = PeakModel.fit(self.measured())
        pick = max(self.fitted_pick(model, failed) or fit, fit)
        largest = max(p.batch_size for p in self.measured())
        wrong_about_failed = model is not None and failed is not None and model.fits(failed, self.usable_bytes)
        if model is None and failed is None:
            candidate = min(self.max_batch, max(self.min_batch + 1, 8 * self.min_batch))
        elif model is None or wrong_about_failed:
            candidate = _middle(fit, failed)
        elif _split(pick, self.effective_batch)[0] > _EXTRAPOLATION_FACTOR * largest:
            candidate = _split(pick, self.effective_batch)[0]
        else:
            return self._trust(fit, pick)
        if self.search_probes >= self.max_probes:
            capped = min(pick, int(_EXTRAPOLATION_FACTOR * largest))  # the split only shrinks it further
            self.notes.append(f"probe budget ({self.max_probes}) spent with the fit pointing at {pick}; "
                              f"not extrapolating past 2x the largest probe: {capped}")
            return self._trust(fit, max(capped, fit))
        if wrong_about_failed:
            self.notes.append(f"the fit predicted {failed} would fit but it did not; bisecting")
        return candidate

    def _trust(self, fit: int, pick: int) -> int:
        """Run the pick's micro-batch as its verification; stop at `fit` when that is no larger."""
        self.pick = pick
        micro = _split(pick, self.effective_batch)[0]
        if micro <= fit:
            return fit
        self.trusted = micro
        return micro

    def _back_off(self, fit: int, failed: int) -> int:
        """After the pick's verification at `failed` ran out of the usable cap: min(refit, 0.9 x it), never below
        `fit`; `fit` itself once ``max_verify`` verifications ran."""
        if self.verify_runs >= self.max_verify:
            self.notes.append(f"{self.max_verify} verification runs failed; falling back to {fit}, the largest size "
                              "measured within the usable budget")
            return self._trust(fit, fit)
        backed_off = int(_BACKOFF_FACTOR * failed)
        fitted = self.fitted_pick(PeakModel.fit(self.measured()), failed)
        if fitted is not None:
            backed_off = min(backed_off, fitted)
        candidate = max(backed_off, fit)
        self.notes.append(f"verification at {failed} ran out of the usable {format_bytes(self.usable_bytes)}; "
                          f"backed off to {candidate}")
        return self._trust(fit, candidate)


def _middle(fit: int, failed: int) -> int:
    """The geometric middle of a bracket (strictly inside it: `largest_fitting` asks only while there is room)."""
    return min(max(int(round(math.sqrt(fit * failed))), fit + 1), failed - 1)


class _FixedCostTooBig(Exception):
    def __init__(self, probe: Probe) -> None:
        super().__init__("fixed cost exceeds the budget")
        self.probe = probe


def _fixed_cost_error(search: _Search, runner: _Runner, first: Probe, margin: float) -> KronosTuneError:
    """One line: what the smallest batch needs, the fixed part, and what would make it fit."""
    b = search.min_batch
    budget, usable = search.budget_bytes, search.usable_bytes
    where = f"budget {format_bytes(budget)} (usable {format_bytes(usable)} with the {margin:.0%} margin)"
    need: int | None = first.peak_bytes
    fixed: float | None = None
    per_sample: float | None = None
    if not isinstance(runner, _CudaRunner):  # diagnose without a cap: the bytes are host RAM or fake
        one = runner.run(b, None, "diagnose")
        two = runner.run(b + 1, None, "diagnose")
        search.probes += [one, two]
        if one.fits and two.fits and one.peak_bytes is not None and two.peak_bytes is not None:
            need = one.peak_bytes
            per_sample = max(two.peak_bytes - one.peak_bytes, 0)
            fixed = one.peak_bytes - per_sample * b
    if need is None:
        return KronosTuneError(f"{where} does not hold one training step at batch size {b} (it ran out of memory "
                               f"at {format_bytes(first.cap_bytes)}); use a smaller model_size, amp = \"bf16\", "
                               f"activation_checkpointing = \"all\" or a larger budget")
    minimum = math.ceil(need / (1 - margin))
    if fixed is not None and per_sample is not None:
        if fixed >= usable:
            fix = ("use a smaller model_size (weights, gradients and optimizer state alone exceed it; amp and "
                   "checkpointing only shrink the per-sample part)")
        else:
            fix = (f"use amp = \"bf16\" or activation_checkpointing = \"all\" to shrink the "
                   f"{format_bytes(per_sample)} per sample, or a smaller model_size")
        return KronosTuneError(f"{where} is smaller than the fixed cost of a training step: "
                               f"{format_bytes(fixed)} before any sample, {format_bytes(need)} at batch size {b}; "
                               f"{fix}, or a budget of at least {format_bytes(minimum)}")
    return KronosTuneError(f"{where} is smaller than the fixed cost of a training step: batch size {b} needs "
                           f"{format_bytes(need)}; use a smaller model_size, amp = \"bf16\", activation_checkpointing "
                           f"= \"all\" or a budget of at least {format_bytes(minimum)}")


def _curve(model: PeakModel | None, probes: list[Probe], pick: int, points: int = 48) -> list[tuple[int, int]]:
    if model is None:
        return [(p.batch_size, int(p.peak_bytes)) for p in probes if p.peak_bytes is not None]
    top = max([pick, *(p.batch_size for p in probes)])
    sizes = sorted({max(1, round(top * 1.15 * i / (points - 1))) for i in range(points)})
    values = model.predict(np.array(sizes))
    return [(int(b), int(v)) for b, v in zip(sizes, values)]


def autobatch(
    step_factory: StepFactory,
    budget_bytes: int,
    margin: float | None = None,
    max_probes: int = 6,
    min_batch: int = 1,
    max_batch: int = 4096,
    eval_factory: StepFactory | None = None,
    device: str | torch.device | None = None,
    estimate: bool = False,
    effective_batch: int | None = None,
    *,
    steps_per_probe: int = 2,
    cuda_emulation: CudaEmulation | None = None,
    round_bytes: int = 1,
    max_verify: int = 4,
    on_probe: OnProbe | None = None,
) -> AutobatchResult:
    """The largest batch size whose real training step (and eval batch) fits ``budget_bytes``.

    Args:
        step_factory: ``step_factory(B)`` builds a training run at batch ``B``
            and returns a callable running one full step (forward, backward,
            optimizer step, zero_grad). If the callable takes a ``meter``
            keyword it gets the meter, for ``meter.phase(name)`` blocks. It may
            have ``close()`` (called after the probe) and, for ``estimate``,
            must have ``.model`` and ``.optimizer``.
        budget_bytes: the device's memory for this process (CPU: simulated).
        margin: fraction of the budget the pick keeps free (0 <= margin < 1);
            None: ``default_margin`` (5% on the exact CPU meter, 10% on CUDA).
        max_probes: search probes at most (verification runs come on top, at
            most ``max_verify``).
        min_batch, max_batch: the range searched.
        eval_factory: ``eval_factory(B)`` -> callable running one eval batch;
            called while the probe's training objects are still alive.
        device: ``cpu`` (default: simulated device of ``budget_bytes``) or
            ``cuda`` (the real card, capped to the budget when bigger).
        estimate: run the whole search on fake tensors (no allocation) with
            ``cuda_emulation`` applied (None: plain CPU accounting).
        effective_batch: keep batch x accumulation at this global batch: the
            search stops at it and the result says how it was split.
        steps_per_probe: training steps per probe (>= 2 measures with AdamW
            state alive; 1 for inference-only steps).
        round_bytes: CPU meter rounding per storage (512 emulates CUDA blocks).
        on_probe: called with each Probe as it completes (progress display).

    On the CPU only what the factory and the steps allocate while the meter
    runs is counted: build the model inside ``step_factory``, not before.
    """
    started = time.perf_counter()
    budget_bytes = _checked_int("budget_bytes", budget_bytes, 1)
    margin = validate_margin(default_margin(device, estimate, cuda_emulation) if margin is None else margin)
    max_probes = _checked_int("max_probes", max_probes, 2)
    min_batch = _checked_int("min_batch", min_batch, 1)
    max_batch = _checked_int("max_batch", max_batch, min_batch)
    steps_per_probe = _checked_int("steps_per_probe", steps_per_probe, 1)
    max_verify = _checked_int("max_verify", max_verify, 1)
    notes: list[str] = []
    search_limit = max_batch
    if effective_batch is not None:
        effective_batch = _checked_int("effective_batch", effective_batch, min_batch)
        if effective_batch < max_batch:
            max_batch = effective_batch
            notes.append(f"search capped at the effective batch {effective_batch}: a larger micro-batch would "
                         "change the optimization")
    usable_bytes = int(budget_bytes * (1.0 - margin))
    runner = _make_runner(step_factory, eval_factory, device, estimate, steps_per_probe, cuda_emulation, round_bytes)
    search = _Search(runner, budget_bytes, usable_bytes, min_batch, max_batch, max_probes, max_verify, effective_batch,
                     on_probe)
    before_bytes = runner.current_bytes()
    try:
        try:
            pick = search.search()
        except _FixedCostTooBig as failure:
            raise _fixed_cost_error(search, runner, failure.probe, margin) from None
        final, accumulation, verified_by, max_fit = _verify(search, pick)
        leftover_bytes = runner.current_bytes() - before_bytes
    finally:
        runner.close()
    if isinstance(runner, _CudaRunner):
        notes.extend(runner.notes)
    notes.extend(search.notes)
    with_eval = " and one eval batch" if eval_factory else ""
    if steps_per_probe >= 2:
        notes.append(f"probe peaks: max over {steps_per_probe} steps from a fresh build (the first optimizer step "
                     f"creates AdamW's state, the second runs with it){with_eval}")
    else:
        notes.append(f"probe peaks: one step per fresh build{with_eval}")
    model = PeakModel.fit(search.measured())
    predicted = model.peak_at(final) if model is not None else int(verified_by.peak_bytes or 0)
    governing = model.governing(final) if model is not None else None
    if model is not None:
        curved = [s.name for s in model.series if s.curved]
        if curved:
            notes.append(f"peak not a straight line in batch size for {', '.join(curved)}: predicted with the "
                         "chord through the probes (conservative between probes)")
    if model is not None and search.max_batch < search_limit and all(search.within_usable(p) for p in search.probes):
        beyond = model.largest_fitting(usable_bytes, min_batch, search_limit)
        if beyond is not None and beyond > search.max_batch:
            notes.append(f"the fit predicts micro-batches up to about {beyond} would fit (not verified): room for "
                         "a larger effective batch")
    measured = int(verified_by.peak_bytes or 0)
    fit_lines = {s.name: (s.fixed_bytes, s.bytes_per_sample) for s in model.series} if model else {}
    fixed, per_sample = (governing.fixed_bytes, governing.bytes_per_sample) if governing else (float(measured), 0.0)
    probe_steps = sum(p.steps_run for p in search.probes)
    return AutobatchResult(
        batch_size=final, accumulation_steps=accumulation, budget_bytes=budget_bytes, usable_bytes=usable_bytes,
        margin=margin, fixed_bytes=int(round(fixed)), bytes_per_sample=float(per_sample),
        predicted_peak_bytes=predicted, measured_peak_bytes=measured, probes=search.probes,
        headroom_bytes=budget_bytes - measured, search_time_s=time.perf_counter() - started,
        step_time_s=verified_by.step_time_s, notes=notes, max_fit_batch_size=max_fit,
        effective_batch=effective_batch, device=runner.device, estimate=estimate,
        governing_series=governing.name if governing else TOTAL_SERIES, fit_lines=fit_lines,
        curve=_curve(model, search.probes, final), probe_steps=probe_steps, leftover_bytes=leftover_bytes,
    )


def _verify(search: _Search, pick: int) -> tuple[int, int, Probe, int]:
    """The final micro-batch (after the accumulation split) and the run that shows it fits: the search's own run
    at it, else one verification under the usable cap; where that fails, or ``max_verify`` runs are spent, the
    largest size measured within the usable budget.

    Returns (batch, accumulation, the run that proves it fits, the memory pick it came from).
    """
    batch, accumulation, how = _split(pick, search.effective_batch)
    good = search.known_good()
    assert good is not None, "the first probe is within the usable budget"
    if good.batch_size == batch:
        proof: Probe | None = good
    elif search.verify_runs < search.max_verify:
        proof = search.probe(batch, kind="verify")
        proof = proof if search.within_usable(proof) else None
    else:
        proof = None
    if proof is None:
        proof, unverified, pick = good, batch, good.batch_size
        batch, accumulation, how = _split(pick, search.effective_batch)
        smaller = "" if batch == good.batch_size else f" (micro-batch {batch} is smaller still)"
        search.notes.append(f"micro-batch {unverified} was not verified within the usable budget; falling back to "
                            f"{good.batch_size}, the largest size measured within it{smaller}")
    if proof.kind == "probe":
        proof.status = "verify"
        search.notes.append(f"batch {batch} was already measured by a probe (the same fresh build and steps) within "
                            "the usable budget: that probe is its verification")
    if how:
        search.notes.append(how)
    return batch, accumulation, proof, pick


def _split(candidate: int, effective_batch: int | None) -> tuple[int, int, str]:
    if effective_batch is None:
        return candidate, 1, ""
    return split_effective_batch(candidate, effective_batch)

