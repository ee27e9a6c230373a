"""Prediction benchmark: KV-cached vs full-recompute generation on the same weights.

    python -m kronos_core.bench predict --size small --series 8 --lookback 400 --pred-len 30
    python -m kronos_core.bench predict --series 1000 --pred-len 120 --paths cached --repeats 1

Series come from a K-line CSV (`--csv`, windows at different offsets) or from
the synthetic generator. Both paths run in this one process, interleaved, with
greedy sampling (top_k=1) so their outputs can be compared exactly.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time

import numpy as np
import pandas as pd
import torch

from kronos_core.bench_phases import breakdown_lines, measure_read_bandwidth, time_phases
from kronos_core.data import FEATURE_COLUMNS, read_kline
from kronos_core.predictor import KronosPredictor
from kronos_core.sizes import build_model, build_tokenizer, size_spec
from kronos_core.synthetic import synthetic_series


def _series_inputs(count: int, lookback: int, pred_len: int, csv: str | None, seed: int):
    """Lists (dfs, x_timestamps, y_timestamps) of `count` windows."""
    need = lookback + pred_len
    if csv:
        frame = read_kline(csv)
        if len(frame) < need:
            raise SystemExit(f"{csv} has {len(frame)} rows; need lookback + pred_len = {need}")
        starts = np.linspace(0, len(frame) - need, num=count).round().astype(int)
        windows = [frame.iloc[s:s + need].reset_index(drop=True) for s in starts]
    else:
        windows = synthetic_series(count, need, seed=seed)
    dfs = [w.iloc[:lookback][list(FEATURE_COLUMNS)].reset_index(drop=True) for w in windows]
    xs = [w["timestamps"].iloc[:lookback].reset_index(drop=True) for w in windows]
    ys = [w["timestamps"].iloc[lookback:].reset_index(drop=True) for w in windows]
    return dfs, xs, ys


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):10.2f} {min(values):10.2f} {max(values):10.2f}"


def bench_predict(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, tokenizer = build_model(args.size, seed=args.seed), build_tokenizer(args.size, seed=args.seed)
    context = args.max_context or size_spec(args.size).context
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    amp = None if args.amp == "none" else args.amp
    dfs, xs, ys = _series_inputs(args.series, args.lookback, args.pred_len, args.csv, args.seed)
    paths = {"cached": True, "recompute": False}
    selected = [name for name in paths if args.paths in (name, "both")]
    predictors = {name: KronosPredictor(model, tokenizer, device=device, max_context=context, amp=amp,
                                        use_cache=paths[name], max_batch_size=args.max_batch_size,
                                        window_mode=args.window_mode)
                  for name in selected}
    source = args.csv or "synthetic"
    print(f"Kronos-{args.size}, {args.series} series from {source}, lookback {args.lookback}, "
          f"pred_len {args.pred_len}, sample_count 1, greedy top_k=1, device {device}, amp {args.amp}, "
          f"window mode {args.window_mode}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.repeats} repeats + 1 warm-up")
    if args.lookback + args.pred_len > context:
        after = "re-fills exactly" if args.window_mode == "refill" else "shifts (approximate)"
        print(f"note: the window slides after {context - args.lookback} steps (max_context {context}); "
              f"the cached path {after} from then on")

    def run(name: str):
        start = time.perf_counter()
        result = predictors[name].predict_batch(dfs, xs, ys, args.pred_len, top_k=1, verbose=False)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - start, result

    outputs: dict[str, list[pd.DataFrame]] = {}
    rates: dict[str, list[float]] = {name: [] for name in selected}
    warmup_len = min(args.pred_len, 4)
    warmup_ys = [y.iloc[:warmup_len] for y in ys[:2]]
    for name in selected:  # warm-up: allocator, kernels, RoPE tables
        predictors[name].predict_batch(dfs[:2], xs[:2], warmup_ys, warmup_len, top_k=1, verbose=False)
    for _ in range(args.repeats):
        for name in selected:
            seconds, outputs[name] = run(name)
            rates[name].append(args.series / seconds)

    print(f"{'path':<12}{'median':>10} {'min':>10} {'max':>10}   series/s")
    for name in selected:
        print(f"{name:<12}{_summary(rates[name])}")
    if len(selected) == 2:
        speedup = statistics.median(rates["cached"]) / statistics.median(rates["recompute"])
        identical = all(a.equals(b) for a, b in zip(outputs["cached"], outputs["recompute"]))
        print(f"speed-up of medians: {speedup:.1f}x; greedy outputs identical: {identical}")
    if args.breakdown and "cached" in predictors:
        _print_breakdown(args, predictors["cached"], dfs, xs, ys, context,
                         statistics.median(args.series / r for r in rates["recompute"]) if "recompute" in rates else None)
    print(f"peak RSS of this process: {_peak_rss_bytes() / 2**30:.2f} GiB")
    if device.startswith("cuda"):
        print(f"peak CUDA allocated: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    return 0


def _print_breakdown(args: argparse.Namespace, predictor: KronosPredictor, dfs, xs, ys, context: int,
                     recompute_seconds: float | None) -> None:
    """Time the cached path's phases over `args.repeats` more runs and print them with their floors."""
    runs = [time_phases(predictor, lambda: predictor.predict_batch(dfs, xs, ys, args.pred_len, top_k=1,
                                                                     verbose=False), args.pred_len)
            for _ in range(args.repeats)]
    rows = min(args.series, predictor.rows_per_chunk(args.max_batch_size, args.lookback, args.pred_len))
    element_bytes = 2 if args.amp != "none" else 4
    bandwidth = measure_read_bandwidth(predictor.device)
    for line in breakdown_lines(runs, predictor.model, rows, args.lookback, args.pred_len, element_bytes,
                                bandwidth, recompute_seconds, context, args.window_mode):
        print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kronos_core.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    predict = sub.add_parser("predict", help="KV-cached vs full-recompute batch prediction")
    predict.add_argument("--size", default="small")
    predict.add_argument("--series", type=int, default=8)
    predict.add_argument("--lookback", type=int, default=400)
    predict.add_argument("--pred-len", type=int, default=30)
    predict.add_argument("--repeats", type=int, default=3)
    predict.add_argument("--paths", choices=["both", "cached", "recompute"], default="both")
    predict.add_argument("--csv", default=None, help="K-line CSV to cut series from (default: synthetic)")
    predict.add_argument("--device", default=None)
    predict.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none")
    predict.add_argument("--max-context", type=int, default=None)
    predict.add_argument("--max-batch-size", type=int, default=None)
    predict.add_argument("--seed", type=int, default=0)
    predict.add_argument("--window-mode", choices=["refill", "shift"], default="refill",
                         help="after the window slides: exact re-fill (default) or approximate shift")
    predict.add_argument("--threads", type=int, default=None, help="intra-op CPU threads (default: torch's)")
    predict.add_argument("--breakdown", action="store_true",
                         help="also time the cached path's phases and print the per-step memory floor and "
                              "the speed-up ceilings")
    args = parser.parse_args(argv)
    return bench_predict(args)


if __name__ == "__main__":
    sys.exit(main())
