"""Helpers of `python -m benchmarks.predict_job`: panels of many symbols, and a command run with its peak RSS.

`write_panel` writes a panel of `series` symbols x `rows` daily bars sorted by symbol (Parquet, in row
groups, so writing a million symbols holds one group; or CSV), random-walk prices. `run_measured` runs a
command line and returns the wall time, what it printed and two peaks of resident memory: the kernel's
(`ru_maxrss` from wait4, exactly what `/usr/bin/time -v` reports as "Maximum resident set size": the
high-water mark of the largest single process of the tree) and the peak of the whole tree's summed RSS (psutil,
polled every 20 ms: it adds the ranks of a sharded run, and can miss a peak shorter than a poll).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

GROUP_SERIES = 10_000  # symbols per Parquet row group while writing


def write_panel(path: Path, series: int, rows: int = 80, seed: int = 0) -> Path:
    """A panel `symbol, timestamps, open, high, low, close, volume, amount`, sorted by symbol."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    stamps = pd.bdate_range("2020-01-01", periods=rows).to_numpy()
    writer = None
    csv_header = True
    for begin in range(0, series, GROUP_SERIES):
        count = min(GROUP_SERIES, series - begin)
        steps = rng.normal(0, 0.01, (count, rows))
        close = 50 * np.exp(np.cumsum(steps, axis=1))
        spread = np.abs(rng.normal(0, 0.005, (count, rows))) * close
        open_ = close * np.exp(rng.normal(0, 0.004, (count, rows)))
        volume = np.round(rng.lognormal(10, 1, (count, rows)))
        columns = {
            "symbol": np.repeat(np.array([f"S{k:07d}" for k in range(begin, begin + count)]), rows),
            "timestamps": np.tile(stamps, count),
            "open": open_.ravel().round(4), "high": (np.maximum(open_, close) + spread).ravel().round(4),
            "low": (np.minimum(open_, close) - spread).ravel().round(4), "close": close.ravel().round(4),
            "volume": volume.ravel(), "amount": (volume * close).ravel().round(2),
        }
        if path.suffix == ".csv":
            pd.DataFrame(columns).to_csv(path, mode="w" if csv_header else "a", header=csv_header, index=False)
            csv_header = False
            continue
        table = pa.table(columns)
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    if writer is not None:
        writer.close()
    return path


@dataclass
class Measured:
    wall_s: float
    peak_rss_bytes: int  # the process tree's summed RSS, polled
    returncode: int
    stdout: str
    stderr: str
    max_rss_bytes: int = 0  # the kernel's ru_maxrss: /usr/bin/time -v's "Maximum resident set size"


def run_measured(command: list[str], env: dict[str, str] | None = None, poll_s: float = 0.02,
                 on_poll=None) -> Measured:
    """Run `command`, polling its process tree's summed RSS; `on_poll(process)` may act on it (e.g. kill; it
    must not wait for the process: this loop reaps it, with wait4, to read its ru_maxrss)."""
    started = time.perf_counter()
    with open(Path("/dev/null")) as stdin:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=stdin, text=True,
                                   env=env, start_new_session=True)
    peak = 0
    root = psutil.Process(process.pid)
    out_chunks: list[str] = []
    err_chunks: list[str] = []
    readers = [threading.Thread(target=lambda s=s, b=b: b.append(s.read()), daemon=True)
               for s, b in ((process.stdout, out_chunks), (process.stderr, err_chunks))]
    for reader in readers:
        reader.start()
    usage = None
    while True:
        pid, status, rusage = os.wait4(process.pid, os.WNOHANG)
        if pid == process.pid:
            process.returncode, usage = os.waitstatus_to_exitcode(status), rusage
            break
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        if on_poll is not None:
            on_poll(process)
        time.sleep(poll_s)
    wall = time.perf_counter() - started
    for reader in readers:
        reader.join()
    max_rss = usage.ru_maxrss * 1024 if usage is not None else 0  # KiB on Linux
    return Measured(wall, peak, process.returncode, "".join(out_chunks), "".join(err_chunks), max_rss)


def predict_command(panel: Path, out: Path, *extra: str, size: str = "tiny", lookback: int = 64,
                    pred_len: int = 4) -> list[str]:
    return [sys.executable, "-m", "kronos_tune.cli", "predict", "--size", size, "--device", "cpu",
            "--lookback", str(lookback), "--pred-len", str(pred_len), "--data", str(panel),
            "--symbol-column", "symbol", "--out", str(out), "--json", *extra]
