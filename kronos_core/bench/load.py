"""Host memory of `from_pretrained`: what loading a pretrained folder adds to a fresh process.

    python -m kronos_core.bench load --size base --repeats 3
    python -m kronos_core.bench load --folder ./Kronos-small --dtype bf16

A random-init predictor of the named size is saved once to a temp folder (or
`--folder` names a saved one); then each repeat loads it in a fresh Python
process, so nothing of an earlier load (allocator pools, mapped pages) counts.
Each process reports two figures against its RSS after the imports:

- load: its peak RSS up to the end of `from_pretrained` (the kernel's
  high-water mark) minus that RSS: what a load costs before the model is used.
  This is the figure the loading path is judged by.
- touched: its RSS once every weight has been read (a sum over each tensor)
  minus that RSS. Weights loaded to the CPU are the file's pages mapped into
  the process, not copies; a mapped page counts in RSS from the first read on,
  so this is what the loaded model holds in use: about one file.

Medians over the repeats are printed with their ratio to the file size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MIB = 2 ** 20
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    load = sub.add_parser("load", help="host memory added by from_pretrained, in fresh processes")
    load.add_argument("--size", default="base", help="model size saved random-init to a temp folder")
    load.add_argument("--folder", default=None, help="a saved predictor folder to load instead of --size")
    load.add_argument("--repeats", type=int, default=3, help="loads, each in a fresh process")
    load.add_argument("--device", default="cpu")
    load.add_argument("--dtype", choices=["default", *_DTYPES], default="default",
                      help="floating-point weights loaded as this dtype (default: the model's own, float32)")


def _measure_in_child(folder: Path, device: str, dtype: str) -> dict:
    command = [sys.executable, "-m", "kronos_core.bench.load", str(folder), device, dtype]
    if os.name == "posix":
        # A process started straight from this one inherits this one's (large) RSS high-water mark across
        # exec on Linux; started from a forked shell it begins with the shell's few MiB.
        command = ["/bin/sh", "-c", '"$0" "$@"; exit $?', *command]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the loading process failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _report(folder: Path, args: argparse.Namespace) -> int:
    from kronos_core.pretrained import WEIGHTS_NAME

    file_bytes = (folder / WEIGHTS_NAME).stat().st_size
    runs = [_measure_in_child(folder, args.device, args.dtype) for _ in range(args.repeats)]
    load = statistics.median(run["peak_load"] - run["before"] for run in runs)
    touched = statistics.median(run["touched"] - run["before"] for run in runs)
    print(f"{folder / WEIGHTS_NAME}: {file_bytes / MIB:,.0f} MiB; device {args.device}, dtype {args.dtype}; "
          f"{len(runs)} loads, each in a fresh process")
    print(f"{'run':<5}{'RSS before':>12}{'peak before':>13}{'peak at load':>14}{'RSS touched':>13}   (MiB)")
    for number, run in enumerate(runs, 1):
        print(f"{number:<5}{run['before'] / MIB:>12,.0f}{run['peak_before'] / MIB:>13,.0f}"
              f"{run['peak_load'] / MIB:>14,.0f}{run['touched'] / MIB:>13,.0f}")
    print(f"load: peak RSS added by from_pretrained {load / MIB:,.0f} MiB = {load / file_bytes:.2f}x the file "
          f"(median)")
    print(f"touched: RSS added once every weight was read {touched / MIB:,.0f} MiB = {touched / file_bytes:.2f}x "
          f"the file (median)")
    if any(run["peak_before"] > run["before"] + 16 * MIB for run in runs):
        print("note: the high-water mark was already above the RSS before loading, so `load` is an upper bound")
    return 0


def bench_load(args: argparse.Namespace) -> int:
    if args.folder:
        return _report(Path(args.folder), args)
    from kronos_core.sizes import build_model

    with tempfile.TemporaryDirectory(prefix="kronos-load-bench-") as temp:
        folder = Path(temp) / args.size
        model = build_model(args.size, seed=0)
        model.save_pretrained(folder)
        del model
        return _report(folder, args)


def _child(folder: str, device: str, dtype: str) -> None:
    """One load in this (fresh) process; prints a JSON line of byte counts."""
    import torch

    from kronos_core.hostmem import peak_rss_bytes, rss_bytes
    from kronos_core.model import Kronos

    chosen = None if dtype == "default" else getattr(torch, _DTYPES[dtype])
    before, peak_before = rss_bytes(), peak_rss_bytes()
    model = Kronos.from_pretrained(folder, device=device, dtype=chosen)
    peak_load = peak_rss_bytes()
    with torch.no_grad():
        checksum = sum(float(tensor.float().sum()) for tensor in model.state_dict().values())
    print(json.dumps({"before": before, "peak_before": peak_before, "peak_load": peak_load,
                      "touched": rss_bytes(), "checksum": checksum}))


if __name__ == "__main__":
    _child(*sys.argv[1:4])
