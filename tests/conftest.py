"""Shared fixtures."""

from __future__ import annotations

import gc
import os

import pytest

# One intra-op thread in this process and in every process the tests start (trial workers, CLI subprocesses and
# torchrun ranks inherit the variable): tiny-model ops are too small to share, and the two test workers already
# keep both cores busy, so a second OpenMP thread per process only spin-waits against the others (under load a
# benchmark trial of a few steps then burns 30 s of CPU instead of 6). A value set by the caller is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402 - after the thread count is set

# pytest-xdist's workers (execnet) set COLUMNS=80 and LINES=24 in their environment; a command's output
# redirected by a user carries no COLUMNS, so the tests see what that user sees (full-width lines). A test of
# COLUMNS itself sets it.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

if os.environ["OMP_NUM_THREADS"].isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # in case a plugin imported torch first


@pytest.fixture
def one_thread():
    """One intra-op thread: tiny-model ops are too small to share, and CI's two cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Test files that run real benchmarks, trainings and launches (trial processes of their own, each importing torch),
# slowest first as measured (CPU seconds per file); the files of tests marked slow (left out of the default run,
# run by `-m slow`) follow in the same order. With --dist loadfile and --no-loadscope-reorder (pyproject.toml) the
# workers take files in collection order, so these start first and the many quick files fill in around them; by
# default xdist would queue files by their number of tests, which puts these few-test, long files last.
SLOW_FILES_FIRST = (
    "test_benchmark_stops.py", "test_tui_jobs.py", "test_benchmark_run.py", "test_benchmark_small_runs.py",
    "test_profile.py", "test_maximize.py", "test_train_predictor.py", "test_autobatch_cli.py", "test_monitor_cli.py",
    "test_presets.py", "test_predict_cli.py", "test_run_logs.py", "test_pareto.py",
    "test_train_ddp.py", "test_predict_sharded.py", "test_train_fsdp.py", "test_train_signals.py",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow files first (a stable sort: every other file, and the order inside each file, stay as they were)."""
    rank = {name: index for index, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FILES_FIRST)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before each test, collect, then move every object still alive (torch, torch._dynamo once an optimizer was
    built, textual, pandas, the test modules: some 400,000 objects) out of the collector's reach. Product code and
    tests call gc.collect() around every autobatch probe and every benchmark trial; without this each of those
    full collections walks all of them again (0.06-0.2 s of CPU each, hundreds of times in a run). What a test
    allocates is collected exactly as before: freezing only skips what was alive before the test began, and
    reference counting still frees whatever is dropped. After the first test the collection here is short too."""
    gc.collect()
    gc.freeze()


@pytest.fixture
def planted_trials(monkeypatch: pytest.MonkeyPatch):
    """The benchmark's trials are planted from outside by benchmarks.planted_trials (its sitecustomize folder and
    the repository root first on PYTHONPATH, so that every trial process imports them), which reads the planted
    faults, effects and worsenings from the environment (the product's worker reads none). Returns that
    module."""
    from benchmarks import planted_trials as entry

    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    entry.use_planted_trials()
    return entry


@pytest.fixture
def steady_dashboard(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the dashboard tests hold still, from outside the app: the host name its status bar shows ("node"),
    and its log pane's lines without time stamps; each line's text is also kept on the pane (`test_lines`, read
    by test_tui_canned.log_text), since the pane keeps none of its own."""
    import socket

    from kronos_tune.tui.widgets.status import LogPane

    add = LogPane.add

    def add_unstamped(pane: LogPane, text: str, level: str = "info", stamp: str = "") -> None:
        pane.__dict__.setdefault("test_lines", []).append(text)
        add(pane, text, level)

    monkeypatch.setattr(socket, "gethostname", lambda: "node")
    monkeypatch.setattr(LogPane, "add", add_unstamped)
