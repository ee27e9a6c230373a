"""Cold `kronos-tune plan` with and without the private PyTorch shortcuts, side by side.

    python -m benchmarks.plan_cold                                   # 4x3080, 5 rounds
    python -m benchmarks.plan_cold --preset 4x3080 --repeats 7
    python -m benchmarks.plan_cold --repeats 1 -- --size mini        # a quick try (arguments after -- go to plan)

Each round runs `kronos-tune plan --preset P --json` twice in fresh processes with the trace cache off
(KRONOS_TUNE_CACHE_DIR=off): once as it is, once with KRONOS_PRIVATE_TORCH=off (every op through
FakeTensorMode's own dispatch; kronos_tune.torch_private), which goes first alternating from round to round.
Prints the median, min and max wall seconds of each and whether every JSON output was byte-identical.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from kronos_tune.torch_private import SHORTCUTS_ENV

WAYS = {"private shortcuts": {}, "public path": {SHORTCUTS_ENV: "off"}}


def _run(command: list[str], extra_env: dict[str, str]) -> tuple[float, bytes]:
    env = {**os.environ, "KRONOS_TUNE_CACHE_DIR": "off", **extra_env}
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return seconds, done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plan_cold", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="4x3080")
    parser.add_argument("--repeats", type=int, default=5, help="rounds; each runs both ways once")
    parser.add_argument("plan_args", nargs="*", help="more arguments for kronos-tune plan (after --)")
    args = parser.parse_args(argv)
    command = [sys.executable, "-m", "kronos_tune.cli", "plan", "--preset", args.preset, "--json", *args.plan_args]
    seconds: dict[str, list[float]] = {name: [] for name in WAYS}
    outputs: set[bytes] = set()
    for round_index in range(args.repeats):
        order = list(WAYS) if round_index % 2 == 0 else list(reversed(WAYS))
        for name in order:
            wall, out = _run(command, WAYS[name])
            seconds[name].append(wall)
            outputs.add(out)
    print(f"kronos-tune plan --preset {args.preset} --json {' '.join(args.plan_args)} (trace cache off), "
          f"{args.repeats} rounds, alternating which goes first")
    for name, values in seconds.items():
        print(f"  {name:18s} median {statistics.median(values):6.2f} s  min {min(values):6.2f}  "
              f"max {max(values):6.2f}  (n={len(values)})")
    print(f"  JSON outputs byte-identical: {len(outputs) == 1}")
    return 0 if len(outputs) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
