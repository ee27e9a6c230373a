"""kronos_core.files (atomic writes, TOML) and kronos_core.hostmem (host memory), on real files and processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from kronos_core import hostmem
from kronos_core.errors import KronosError
from kronos_core.files import (
    atomic_path,
    atomic_writer,
    dumps_toml,
    load_toml,
    write_text_atomic,
    write_toml,
)

OLD = "the previous content\n"


def _only(folder: Path, name: str) -> None:
    """Nothing but `name` in the folder: no temp file was left behind."""
    assert sorted(p.name for p in folder.iterdir()) == [name]


def test_replaces_the_file_and_leaves_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    write_text_atomic(target, OLD)
    write_text_atomic(target, "new\n")
    assert target.read_text() == "new\n"
    with atomic_writer(target, "wb") as handle:
        handle.write(b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    _only(tmp_path, "notes.txt")


def test_an_error_inside_the_block_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_text(OLD)
    with pytest.raises(RuntimeError, match="stopped halfway"):
        with atomic_writer(target) as handle:
            handle.write("{\"half\": ")
            handle.flush()
            raise RuntimeError("stopped halfway")
    assert target.read_text() == OLD
    _only(tmp_path, "report.json")


def test_an_unencodable_value_midway_keeps_the_old_file(tmp_path: Path) -> None:
    """json.dump writes piece by piece: the first keys reach the temp file before the set fails."""
    target = tmp_path / "metrics.json"
    target.write_text(OLD)
    values = {"step": 3, "loss": [0.5] * 10_000, "bad": {1, 2}}
    with pytest.raises(TypeError, match="not JSON serializable"):
        with atomic_writer(target) as handle:
            json.dump(values, handle)
    assert target.read_text() == OLD
    _only(tmp_path, "metrics.json")


def test_a_failing_torch_save_keeps_the_old_checkpoint(tmp_path: Path) -> None:
    target = tmp_path / "last.pt"
    torch.save({"step": 1}, target)
    with pytest.raises(Exception, match="pickle|lambda"):
        with atomic_path(target) as temp:
            torch.save({"weights": torch.zeros(1000), "hook": lambda: None}, temp)
    assert torch.load(target, weights_only=True) == {"step": 1}
    _only(tmp_path, "last.pt")


def test_a_string_the_encoding_cannot_hold_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "table.csv"
    target.write_text(OLD)
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(target, "a,b\n" * 1000 + "\udc80")  # a lone surrogate has no UTF-8 form
    assert target.read_text() == OLD
    _only(tmp_path, "table.csv")


def test_writers_that_go_by_the_suffix_write_the_target(tmp_path: Path) -> None:
    """numpy.save appends .npy to a name without it; the temp name keeps the suffix, so the target is written."""
    target = tmp_path / "part-00000.npy"
    with atomic_path(target) as temp:
        assert temp.suffix == ".npy" and temp.parent == tmp_path and temp.name.startswith(".part-00000.npy.")
        np.save(temp, np.arange(5))
    assert np.load(target).tolist() == [0, 1, 2, 3, 4]
    _only(tmp_path, "part-00000.npy")


def test_new_files_follow_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "config.toml", "a = 1\n")
    finally:
        os.umask(previous)
    assert (tmp_path / "config.toml").stat().st_mode & 0o777 == 0o644


def test_a_missing_folder_is_an_os_error_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_text_atomic(tmp_path / "nope" / "x.txt", "x")
    assert list(tmp_path.iterdir()) == []


_WRITER = textwrap.dedent("""
    import sys
    from kronos_core.files import atomic_writer
    target, letter, size, times = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[4])
    for _ in range(times):
        with atomic_writer(target, "wb") as handle:
            handle.write(letter * size)
""")


def test_two_processes_writing_one_file_never_mix(tmp_path: Path) -> None:
    """Two writers replace the same file over and over while this process reads it: every read is one
    writer's whole content, never a blend or a truncated file."""
    target = tmp_path / "shared.bin"
    size = 1 << 20
    target.write_bytes(b"o" * size)
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(target), letter, str(size), "40"])
               for letter in ("a", "b")]
    reads: set[bytes] = set()
    try:
        while any(w.poll() is None for w in writers):
            data = target.read_bytes()
            assert len(data) == size and data.count(data[:1]) == size, "a read saw a mixed or short file"
            reads.add(data[:1])
    finally:
        for writer in writers:
            writer.wait(timeout=120)
    assert [w.returncode for w in writers] == [0, 0]
    final = target.read_bytes()
    assert final in (b"a" * size, b"b" * size)
    assert reads <= {b"o", b"a", b"b"}
    _only(tmp_path, "shared.bin")


# TOML -----------------------------------------------------------------------------------------------------

def test_toml_round_trip_leaves_out_none_and_keeps_the_header(tmp_path: Path) -> None:
    values = {"name": "run \"one\"\ttab", "lr": 1e-5, "steps": 3, "amp": None, "betas": [0.9, 0.95],
              "flag": False, "nested": {"size": "tiny", "gone": None, "depth": 2}}
    path = tmp_path / "run.toml"
    write_toml(path, values, header="first line\n\nthird line")
    text = path.read_text()
    assert text.startswith("# first line\n#\n# third line\n")
    assert "amp" not in text and "gone" not in text
    expected = {key: value for key, value in values.items() if value is not None}
    expected["nested"] = {"size": "tiny", "depth": 2}
    assert load_toml(path) == expected


def test_toml_keeps_non_finite_floats() -> None:
    text = dumps_toml({"a": float("inf"), "b": float("-inf")})
    assert text == "a = inf\nb = -inf\n"


def test_a_value_toml_cannot_hold_is_one_line() -> None:
    with pytest.raises(KronosError) as caught:
        dumps_toml({"when": object()})
    assert "cannot write as TOML" in str(caught.value) and "\n" not in str(caught.value)


def test_load_toml_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(KronosError) as caught:
        load_toml(missing, what="preset file", fix="run kronos-tune presets")
    assert str(caught.value) == f"{missing}: preset file not found; run kronos-tune presets"
    broken = tmp_path / "broken.toml"
    broken.write_text("a = 1\n[table\nb = 2\n")
    with pytest.raises(KronosError) as caught:
        load_toml(broken)
    message = str(caught.value)
    assert message.startswith(f"{broken}: malformed TOML") and "line 2" in message and "\n" not in message


# Host memory ----------------------------------------------------------------------------------------------

def test_memory_figures_are_plausible() -> None:
    total, available = hostmem.total_ram_bytes(), hostmem.available_ram_bytes()
    rss = hostmem.rss_bytes()
    assert 0 < available <= total and 0 < rss <= total
    assert hostmem.peak_rss_bytes() >= rss
    assert hostmem.tree_rss_bytes() >= rss


def test_the_peak_remembers_a_freed_allocation() -> None:
    block = np.ones(96 << 20, dtype=np.uint8)  # touched pages: resident
    held = hostmem.rss_bytes()
    del block
    assert hostmem.rss_bytes() < held - (64 << 20)  # the block went back to the system
    # The kernel counts resident pages in per-CPU batches: allow a few MiB, far below the 96 MiB block.
    assert hostmem.peak_rss_bytes() >= held - (4 << 20)


def test_tree_rss_counts_a_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; b = bytearray(64 << 20); print('ready', flush=True);"
                              " sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        own, theirs = hostmem.rss_bytes(), hostmem.rss_bytes(child.pid)
        assert theirs >= 64 << 20
        assert hostmem.tree_rss_bytes() >= own + theirs - (8 << 20)  # own RSS may move a little between reads
    finally:
        child.communicate("", timeout=30)
    with pytest.raises(psutil.NoSuchProcess):
        hostmem.rss_bytes(child.pid)
