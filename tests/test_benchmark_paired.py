"""The paired design for real: two live trial workers on the tiny model, paused between blocks, a planted effect.

The decision benchmark's own machinery (benchmarks.decisions: BenchRun, start_worker) drives them, so this also
checks that `python -m benchmarks.decisions` can run. No timing is asserted: a 30% planted effect is found (the
interval lies below 1), whatever the machine's speed.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from benchmarks.decisions import BenchRun, paired_once, start_worker, verdict_counts
from kronos_tune.benchmark.run.paired import EXTENSION_FACTOR, MAX_STRETCH, Interleaver
from kronos_tune.benchmark.options import BenchmarkOptions
from kronos_tune.benchmark.stats import MIN_PAIRS, paired_compare


def test_a_planted_delay_is_found_by_two_live_workers_in_alternating_blocks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted_trials) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the workers' tiny steps are too small to share; CI's cores are
    run = BenchRun(tmp_path, BenchmarkOptions(seed=7, block_s=0.02, min_rounds=10, target_ci=0.0, max_rounds=40))
    base, trial = start_worker(run, "baseline", 7), start_worker(run, "trial", 7)
    try:
        pids = [p.pid for p in psutil.Process().children(recursive=True) if "trial_worker" in " ".join(p.cmdline())]
        assert len(pids) == 2
        time.sleep(0.5)
        before = [sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids]
        time.sleep(1.0)  # between blocks both wait in a read of their command pipe, using no CPU
        after = [sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids]
        assert all(b - a < 0.05 for a, b in zip(before, after)), (before, after)
        ratios = paired_once(run, base, trial, 0.30, 3.0, 2, "planted")
        found = paired_compare(ratios, 0.02)
        assert len(ratios) >= 10 and found.verdict == "faster" and found.high < 1
        assert found.ratio == pytest.approx(0.70, abs=0.12)
        # a minimum of rounds runs past the budget, but no further than MAX_STRETCH budgets
        capped = Interleaver(run, "capped", 2, 0.4, min_rounds=100_000)
        started = time.perf_counter()
        capped.measure(base, trial)
        assert capped.stop == "time-cap" and 1 <= len(capped.blocks) < 100_000
        assert MAX_STRETCH * 0.4 <= capped.measure_time_s <= time.perf_counter() - started
        assert capped.timing()["min_rounds"] == 100_000
        # an interval once there are pairs enough for one (a loaded machine may give fewer in 1 s)
        assert (capped.halfwidth < float("inf")) == (len(capped.blocks) >= MIN_PAIRS)
        # a change whose verdict its rounds leave open when the budget is spent goes on, once, to 3x the rounds
        seen: list[int] = []
        kept_open = Interleaver(run, "open", 1, 0.3, min_rounds=6,
                                open_verdict=lambda ratios: seen.append(len(ratios)) or True)
        kept_open.measure(base, trial)
        assert seen == [kept_open.extended_after] and kept_open.extended_after >= 6  # asked once, at the budget
        assert len(kept_open.blocks) > kept_open.extended_after and kept_open.stop in ("extended", "time-cap", "max-rounds")
        if kept_open.stop == "extended":
            assert len(kept_open.blocks) == EXTENSION_FACTOR * kept_open.extended_after
        assert kept_open.timing()["extended_after"] == kept_open.extended_after
        shut = Interleaver(run, "shut", 1, 0.3, min_rounds=6, open_verdict=lambda ratios: False)
        shut.measure(base, trial)
        assert shut.extended_after is None and shut.stop in ("budget", "time-cap")
    finally:
        base.close()
        trial.close()
    assert not base.alive and not trial.alive
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


@pytest.mark.slow  # a whole benchmark or job run: the default suite stays under 300 s
def test_an_evaluation_inside_the_rounds_is_followed_by_untimed_blocks(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run = BenchRun(tmp_path, BenchmarkOptions(seed=3, block_s=0.02, min_rounds=20, target_ci=0.0, max_rounds=20))
    # 3 to 10 warm-up steps, the metered step and the first untimed block come before the rounds: step 14 is
    # in round 2 to 9
    base, trial = start_worker(run, "baseline", 3), start_worker(run, "trial", 3, eval_step=14)
    try:
        interleaver = Interleaver(run, "evaluates", 1, 30.0)
        first_id = next(trial.ids)  # block commands are numbered: the count of blocks the trial ran
        interleaver.measure(base, trial)
        assert next(trial.ids) - first_id - 1 == 20 + 1 + 1  # the rounds, the first untimed block, the settle
        assert len(interleaver.blocks) == 20 and interleaver.stop == "max-rounds"
        settled = interleaver.timing()["settled_after"]
        assert len(settled) == 1 and 2 <= settled[0] <= 9, settled
        assert trial.block(1) and not trial.evaluated_in_block  # the evaluation ran once, in that round
        # without an evaluation among the rounds nothing is settled
        plain = Interleaver(run, "plain", 1, 30.0)
        first_id = next(trial.ids)
        plain.measure(base, trial)
        assert next(trial.ids) - first_id - 1 == 20 + 1
        assert plain.timing()["settled_after"] == [] and len(plain.blocks) == 20
    finally:
        base.close()
        trial.close()


def test_the_benchmark_table_counts_false_positives_and_detections() -> None:
    rows = [{"load": "none", "design": "paired", "effect": 0.0, "verdict": "same", "resolution": 0.02},
            {"load": "none", "design": "paired", "effect": 0.0, "verdict": "faster", "resolution": 0.04},
            {"load": "none", "design": "paired", "effect": 0.10, "verdict": "faster", "resolution": 0.02},
            {"load": "none", "design": "paired", "effect": 0.03, "verdict": "same", "resolution": 0.02}]
    counts = verdict_counts(rows, "paired", "none")
    assert counts["repeats"] == 2 and counts["false_faster"] == 1 and counts["false_slower"] == 0
    assert counts["detected_10pct"] == "1/1" and counts["detected_3pct"] == "0/1" and counts["detected_5pct"] == "0/0"
    assert counts["resolution_median_pct"] == pytest.approx(3.0)
