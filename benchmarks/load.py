"""Host memory of `from_pretrained`: what loading a pretrained folder adds to a fresh process.

    python -m benchmarks.load --size base --repeats 3
    python -m benchmarks.load --folder ./Kronos-small --dtype bf16
    python -m benchmarks.load --size small --hub                       # folder vs hub id, temp cache
    python -m benchmarks.load --hub-id NeoQuasar/Kronos-small          # an id in your HF cache

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

With `--hub` (the weights put into a temporary Hugging Face cache laid out as the
library does: refs/main and snapshots/<commit>/ linked into blobs/) or `--hub-id ID`
(an id already in your cache), every repeat loads the same weights twice, each in
a fresh process and offline: from the snapshot folder, then by hub id. It prints
both loads' figures, whether the weights (SHA-256 of every tensor's bytes) and the
outputs (s1 logits of a fixed token batch) are bit-identical, and the ratio of the
hub load's peak RSS to the folder load's (the target: within 1.2x; the hub load
also imports huggingface_hub).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import child_env

MIB = 2 ** 20
CHILD_FLAG = "--measure-in-this-process"
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [CHILD_FLAG]:
        _child(*argv[1:4])
        return 0
    load = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    load.add_argument("--size", default="base", help="model size saved random-init to a temp folder")
    load.add_argument("--folder", default=None, help="a saved predictor folder to load instead of --size")
    load.add_argument("--repeats", type=int, default=3, help="loads, each in a fresh process")
    load.add_argument("--device", default="cpu")
    load.add_argument("--dtype", choices=["default", *_DTYPES], default="default",
                      help="floating-point weights loaded as this dtype (default: the model's own, float32)")
    load.add_argument("--hub", action="store_true",
                      help="also load the weights by hub id from a temporary Hugging Face cache (needs the "
                           "[hub] extra) and compare with the folder load")
    load.add_argument("--hub-id", default=None,
                      help="compare the folder load with a load by this hub id (OWNER/NAME[@REV]) from your "
                           "Hugging Face cache, offline")
    return bench_load(load.parse_args(argv))


def _measure_in_child(source: Path | str, device: str, dtype: str, env: dict[str, str] | None = None) -> dict:
    command = [sys.executable, "-m", "benchmarks.load", CHILD_FLAG, str(source), device, dtype]
    if os.name == "posix":
        # A process started straight from this one inherits this one's (large) RSS high-water mark across
        # exec on Linux; started from a forked shell it begins with the shell's few MiB.
        command = ["/bin/sh", "-c", '"$0" "$@"; exit $?', *command]
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=child_env(env))
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


def _hub_report(folder: Path, hub_id: str, env: dict[str, str], args: argparse.Namespace) -> int:
    """Folder load and hub-id load alternating, each in a fresh offline process."""
    from kronos_core.pretrained import WEIGHTS_NAME

    file_bytes = (folder / WEIGHTS_NAME).stat().st_size
    runs: dict[str, list[dict]] = {"folder": [], "hub id": []}
    for _ in range(args.repeats):
        runs["folder"].append(_measure_in_child(folder, args.device, args.dtype, env))
        runs["hub id"].append(_measure_in_child(hub_id, args.device, args.dtype, env))
    print(f"{hub_id} -> {folder}: {file_bytes / MIB:,.0f} MiB; device {args.device}, dtype {args.dtype}; "
          f"{args.repeats} loads of each, alternating, each in a fresh offline process")
    print(f"{'load':<8}{'run':<5}{'RSS before':>12}{'peak at load':>14}{'RSS touched':>13}   (MiB)")
    for name, measured in runs.items():
        for number, run in enumerate(measured, 1):
            print(f"{name:<8}{number:<5}{run['before'] / MIB:>12,.0f}{run['peak_load'] / MIB:>14,.0f}"
                  f"{run['touched'] / MIB:>13,.0f}")
    peak = {name: statistics.median(run["peak_load"] for run in measured) for name, measured in runs.items()}
    added = {name: statistics.median(run["peak_load"] - run["before"] for run in measured)
             for name, measured in runs.items()}
    every = runs["folder"] + runs["hub id"]
    same_weights = len({run["weights_sha256"] for run in every}) == 1
    same_outputs = len({run["outputs_sha256"] for run in every}) == 1
    print(f"weights bit-identical: {'yes' if same_weights else 'NO'}; outputs bit-identical: "
          f"{'yes' if same_outputs else 'NO'} (SHA-256 over {len(every)} loads)")
    print(f"peak RSS through the load (median): folder {peak['folder'] / MIB:,.0f} MiB, hub id "
          f"{peak['hub id'] / MIB:,.0f} MiB = {peak['hub id'] / peak['folder']:.3f}x (target <= 1.2x)")
    print(f"added by from_pretrained (median): folder {added['folder'] / MIB:,.1f} MiB, hub id "
          f"{added['hub id'] / MIB:,.1f} MiB (the hub load includes importing huggingface_hub)")
    return 0 if same_weights and same_outputs else 1


def write_hub_cache(folder: Path, cache: Path, repo_id: str) -> str:
    """Lay `folder`'s files into `cache` as the library does (refs/main -> snapshots/<commit>/ -> blobs/)."""
    from kronos_core.hub import NEEDED_FILES

    repo = cache / ("models--" + repo_id.replace("/", "--"))
    digests = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in NEEDED_FILES}
    commit = hashlib.sha1("".join(digests.values()).encode()).hexdigest()  # 40 hex digits, like a git commit
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for name, digest in digests.items():
        blob = repo / "blobs" / digest
        blob.write_bytes((folder / name).read_bytes())
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return commit


def bench_load(args: argparse.Namespace) -> int:
    if args.hub_id:
        from kronos_core.hub import resolve_pretrained

        found = resolve_pretrained(args.hub_id, offline=True)
        return _hub_report(found.path, args.hub_id, {"HF_HUB_OFFLINE": "1"}, args)
    with tempfile.TemporaryDirectory(prefix="kronos-load-bench-") as temp:
        if args.folder:
            folder = Path(args.folder)
        else:
            from kronos_core.sizes import build_model

            folder = Path(temp) / args.size
            model = build_model(args.size, seed=0)
            model.save_pretrained(folder)
            del model
        if not args.hub:
            return _report(folder, args)
        cache, repo_id = Path(temp) / "hf-cache", f"kronos-bench/{folder.name}"
        commit = write_hub_cache(folder, cache, repo_id)
        snapshot = cache / ("models--" + repo_id.replace("/", "--")) / "snapshots" / commit
        return _hub_report(snapshot, repo_id, {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}, args)


def _child(folder: str, device: str, dtype: str) -> None:
    """One load in this (fresh) process (`folder`: a folder or hub id); prints a JSON line of byte counts and
    the SHA-256 of the weights and of a forward pass's output."""
    import torch

    from kronos_core.hostmem import peak_rss_bytes, rss_bytes
    from kronos_core.model import Kronos

    chosen = None if dtype == "default" else getattr(torch, _DTYPES[dtype])
    before, peak_before = rss_bytes(), peak_rss_bytes()
    model = Kronos.from_pretrained(folder, device=device, dtype=chosen)
    peak_load = peak_rss_bytes()
    weights = hashlib.sha256()
    with torch.no_grad():
        checksum = 0.0
        for key, tensor in model.state_dict().items():
            checksum += float(tensor.float().sum())
            weights.update(key.encode())
            weights.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        touched = rss_bytes()
        model.eval()
        generator = torch.Generator().manual_seed(0)
        s1 = torch.randint(0, 2 ** model.s1_bits, (2, 16), generator=generator).to(device)
        s2 = torch.randint(0, 2 ** model.s2_bits, (2, 16), generator=generator).to(device)
        logits, _ = model.decode_s1(s1, s2)
    outputs = hashlib.sha256(logits.float().cpu().numpy().tobytes()).hexdigest()
    print(json.dumps({"before": before, "peak_before": peak_before, "peak_load": peak_load, "touched": touched,
                      "checksum": checksum, "weights_sha256": weights.hexdigest(), "outputs_sha256": outputs}))


if __name__ == "__main__":
    sys.exit(main())
