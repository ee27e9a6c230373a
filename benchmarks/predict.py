"""Prediction benchmark: KV-cached vs full-recompute generation on the same weights, and the host path alone.

    python -m benchmarks.predict --size small --series 8 --lookback 400 --pred-len 30
    python -m benchmarks.predict --series 2048 --pred-len 120 --paths cached --amp bf16 --breakdown
    python -m benchmarks.predict --size tiny --series 2048 --pred-len 8 --paths host --input panel

Series come from a K-line CSV (`--csv`, windows at different offsets) or from
the synthetic generator; `--input lists` passes them to predict_batch as
per-series DataFrames, `--input panel` as one long DataFrame with a symbol
column (predict_panel, panel out). Both paths run in this one process,
interleaved, with greedy sampling (top_k=1) so their outputs can be compared
exactly. The first full-size call is reported apart from the steady state
(the median over the later calls): it pays for allocator growth, kernel
selection and graph capture. `--paths host` times only the host work
(inputs to arrays, outputs to frames), without the model.

The host memory `from_pretrained` adds is measured apart: `python -m benchmarks.load`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import pandas as pd
import torch

from benchmarks.predict_phases import breakdown_lines, measure_read_bandwidth, time_phases
from kronos_core.data.kline import FEATURE_COLUMNS, read_kline
from kronos_core.hostmem import peak_rss_bytes
from kronos_core.predict.panel import panel_frame, panel_inputs, predict_panel
from kronos_core.predict.arrays import prepare_lists
from kronos_core.predict.predictor import KronosPredictor
from kronos_core.sizes import build_model, build_tokenizer, size_spec
from kronos_core.units import format_bytes
from kronos_core.data.synthetic import synthetic_series


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


def _panel(dfs, xs, ys) -> tuple[pd.DataFrame, dict[str, pd.Series]]:
    """The same windows as one long frame with a symbol column, and each symbol's future stamps."""
    names = [f"S{i:05d}" for i in range(len(dfs))]
    parts = [df.assign(symbol=name, timestamps=x.to_numpy()) for name, df, x in zip(names, dfs, xs)]
    return pd.concat(parts, ignore_index=True), dict(zip(names, ys))


def _rates_line(name: str, rates: list[float]) -> str:
    first, steady = rates[0], rates[1:] or rates[:1]
    return (f"{name:<12}{first:>12.1f} {statistics.median(steady):>14.1f} {min(steady):>10.1f} "
            f"{max(steady):>10.1f} {len(steady):>8}")


RATES_HEADER = (f"{'path':<12}{'first call':>12} {'steady median':>14} {'min':>10} {'max':>10} {'runs':>8}"
                "   (series/s; steady = calls after the first)")


def _host_only(args: argparse.Namespace, dfs, xs, ys) -> int:
    """Time the host work alone: inputs to arrays and outputs to frames, with zeros for predictions."""
    panel, futures = _panel(dfs, xs, ys) if args.input == "panel" else (None, None)
    rates = []
    for _ in range(args.repeats + 1):
        start = time.perf_counter()
        if panel is not None:
            inputs = panel_inputs(panel, args.lookback, futures, pred_len=args.pred_len)
            panel_frame(inputs, np.zeros((len(inputs.symbols), args.pred_len, 6), np.float32))
        else:
            prepared = prepare_lists(dfs, xs, ys, args.pred_len)
            values = np.zeros((args.series, args.pred_len, 6), np.float32)
            columns = pd.Index(FEATURE_COLUMNS)
            [pd.DataFrame(v, columns=columns, index=i) for v, i in zip(values, prepared.indexes)]
        rates.append(args.series / (time.perf_counter() - start))
    print(f"host path only ({args.input} in and out, no model)")
    print(RATES_HEADER)
    print(_rates_line("host", rates))
    return 0


def bench_predict(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dfs, xs, ys = _series_inputs(args.series, args.lookback, args.pred_len, args.csv, args.seed)
    source = args.csv or "synthetic"
    print(f"Kronos-{args.size}, {args.series} series from {source} as {args.input}, lookback {args.lookback}, "
          f"pred_len {args.pred_len}, sample_count 1, greedy top_k=1, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    if args.paths == "host":
        return _host_only(args, dfs, xs, ys)
    model, tokenizer = build_model(args.size, seed=args.seed), build_tokenizer(args.size, seed=args.seed)
    context = args.max_context or size_spec(args.size).context
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    amp = None if args.amp == "none" else args.amp
    graphs = {"auto": None, "on": True, "off": False}[args.cuda_graphs]
    paths = {"cached": True, "recompute": False}
    selected = [name for name in paths if args.paths in (name, "both")]
    predictors = {name: KronosPredictor(model, tokenizer, device=device, max_context=context, amp=amp,
                                        use_cache=paths[name], max_batch_size=args.max_batch_size,
                                        window_mode=args.window_mode, cuda_graphs=graphs,
                                        static_cache=args.static_cache)
                  for name in selected}
    decode_step = predictors[selected[0]].decode_step
    print(f"device {device}, amp {args.amp}, window mode {args.window_mode}, cached steps: {decode_step}; "
          f"1 small warm-up call, then {args.repeats} full-size calls per path")
    if args.lookback + args.pred_len > context:
        after = "re-fills exactly" if args.window_mode == "refill" else "shifts (approximate)"
        print(f"note: the window slides after {context - args.lookback} steps (max_context {context}); "
              f"the cached path {after} from then on")
    panel, futures = _panel(dfs, xs, ys) if args.input == "panel" else (None, None)

    def call(predictor: KronosPredictor):
        if panel is None:
            return predictor.predict_batch(dfs, xs, ys, args.pred_len, top_k=1, verbose=False)
        inputs = panel_inputs(panel, args.lookback, futures, pred_len=args.pred_len)
        predictor.mark_phase("prepare")
        frame = predict_panel(predictor, inputs, top_k=1)
        return [part.reset_index(drop=True) for _, part in frame.groupby("symbol", sort=False)[list(FEATURE_COLUMNS)]]

    def run(name: str):
        start = time.perf_counter()
        result = call(predictors[name])
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - start, result

    outputs: dict[str, list[pd.DataFrame]] = {}
    rates: dict[str, list[float]] = {name: [] for name in selected}
    warmup_len = min(args.pred_len, 4)
    warmup_ys = [y.iloc[:warmup_len] for y in ys[:2]]
    for name in selected:  # small warm-up: kernels, RoPE tables; the first full-size call is reported apart
        predictors[name].predict_batch(dfs[:2], xs[:2], warmup_ys, warmup_len, top_k=1, verbose=False)
    for _ in range(args.repeats):
        for name in selected:
            seconds, outputs[name] = run(name)
            rates[name].append(args.series / seconds)

    print(RATES_HEADER)
    for name in selected:
        print(_rates_line(name, rates[name]))
    if len(selected) == 2:
        speedup = statistics.median(rates["cached"][1:] or rates["cached"]) / \
            statistics.median(rates["recompute"][1:] or rates["recompute"])
        identical = all(np.array_equal(a.to_numpy(), b.to_numpy())
                        for a, b in zip(outputs["cached"], outputs["recompute"]))
        print(f"speed-up of steady medians: {speedup:.1f}x; greedy outputs identical: {identical}")
    if args.breakdown and "cached" in predictors:
        steady = rates["cached"][1:] or rates["cached"]
        recompute = statistics.median(args.series / r for r in rates["recompute"]) if "recompute" in rates else None
        _print_breakdown(args, predictors["cached"], call, context, recompute, args.series / statistics.median(steady))
    print(f"peak RSS of this process: {format_bytes(peak_rss_bytes(), 'GiB')}")
    if device.startswith("cuda"):
        print(f"peak CUDA allocated: {format_bytes(torch.cuda.max_memory_allocated(), 'GiB')}")
    return 0


def _print_breakdown(args: argparse.Namespace, predictor: KronosPredictor, call, context: int,
                     recompute_seconds: float | None, timed_seconds: float) -> None:
    """Time the cached path's phases over `args.repeats` more runs and print them with their floors."""
    runs = [time_phases(predictor, lambda: call(predictor), args.pred_len) for _ in range(args.repeats)]
    rows = min(args.series, predictor.rows_per_call(args.max_batch_size, args.lookback, args.pred_len))
    element_bytes = 2 if args.amp != "none" else 4
    bandwidth = measure_read_bandwidth(predictor.device)
    for line in breakdown_lines(runs, predictor.model, rows, args.lookback, args.pred_len, element_bytes,
                                bandwidth, recompute_seconds, context, args.window_mode):
        print(line)
    phase_total = statistics.median(r.total for r in runs)
    host = statistics.median(r.host for r in runs)
    print(f"phases sum to {phase_total * 1e3:.0f} ms (median of {len(runs)} phase-timed calls, which synchronize "
          f"at every mark); timed steady-state call {timed_seconds * 1e3:.0f} ms: phase sum / timed = "
          f"{phase_total / timed_seconds:.3f}")
    print(f"host work (preparation + output frames) {host * 1e3:.0f} ms = {args.series / host:,.0f} series/s "
          f"for the host path alone")


def main(argv: list[str] | None = None) -> int:
    predict = argparse.ArgumentParser(prog="python -m benchmarks.predict", description=__doc__,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
    predict.add_argument("--size", default="small")
    predict.add_argument("--series", type=int, default=8)
    predict.add_argument("--lookback", type=int, default=400)
    predict.add_argument("--pred-len", type=int, default=30)
    predict.add_argument("--repeats", type=int, default=3, help="full-size calls per path (the first is reported "
                                                                "apart as the first call)")
    predict.add_argument("--paths", choices=["both", "cached", "recompute", "host"], default="both")
    predict.add_argument("--input", choices=["lists", "panel"], default="lists",
                         help="per-series DataFrames (predict_batch) or one panel DataFrame (predict_panel)")
    predict.add_argument("--csv", default=None, help="K-line CSV to cut series from (default: synthetic)")
    predict.add_argument("--device", default=None)
    predict.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none")
    predict.add_argument("--max-context", type=int, default=None)
    predict.add_argument("--max-batch-size", type=int, default=None)
    predict.add_argument("--seed", type=int, default=0)
    predict.add_argument("--window-mode", choices=["refill", "shift"], default="refill",
                         help="after the window slides: exact re-fill (default) or approximate shift")
    predict.add_argument("--cuda-graphs", choices=["auto", "on", "off"], default="auto",
                         help="CUDA-graph replay of the cached one-token steps (auto: on with CUDA)")
    predict.add_argument("--static-cache", action="store_true",
                         help="fixed-shape cached steps without graphs (the eager form of what graphs replay)")
    predict.add_argument("--threads", type=int, default=None, help="intra-op CPU threads (default: torch's)")
    predict.add_argument("--breakdown", action="store_true",
                         help="also time the cached path's phases and print the per-step memory floor and "
                              "the speed-up ceilings")
    return bench_predict(predict.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
