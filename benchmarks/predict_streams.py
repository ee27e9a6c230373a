"""Per-series random streams: is a series' forecast the same however it is batched, and what do the streams cost?

    python -m benchmarks.predict_streams --sizes mini,small --series 1000     # invariance (no timing)
    python -m benchmarks.predict_streams --only cost --rows 256 --repeats 9   # cost of the streams (timing)

Invariance: the same N synthetic series (random-init weights) predicted as one
batch (the reference), in reversed order, in calls of 7 (`max_batch_size`), and
each alone (calls of 1; `--compositions` picks), for each sampling mode:

- "greedy-plain": top_k=1 without keys, as before this change (no padding of the call);
- "greedy-keys" and "sampled-keys" (T 1.0, top-p 0.9): each series with its
  own stream and the call padded to whole row blocks (streams.pad_rows).

For each composition it counts the series whose generated tokens differ from the
reference's, the share of differing tokens, and the series whose output values
differ (any bit), with the largest difference. Tokens are read by wrapping the
predictor's call of `generate_tokens` (instrumentation of this benchmark only).

Cost: the decode loop (`generate_tokens`, mini, `--rows` rows, CPU) sampling
from the global generator (multinomial) against the per-row streams (inverse
CDF), interleaved in the same process, alternating which goes first; then the
same for the sampling call alone on fixed logits. Prints median, min-max and the
per-pair ratio (streams / global) with its range, over `--repeats` pairs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

import kronos_core.predict.predictor as predictor_module
from kronos_core.data.kline import FEATURE_COLUMNS, calendar_features_ns, wall_clock_ns
from kronos_core.data.synthetic import synthetic_series
from kronos_core.predict.generation import SamplingParams, generate_tokens, sample_tokens
from kronos_core.predict.predictor import KronosPredictor
from kronos_core.predict.streams import RowStreams, series_key
from kronos_core.sizes import build_model, build_tokenizer

MODES = {"greedy-plain": (dict(top_k=1), False), "greedy-keys": (dict(top_k=1), True),
         "sampled-keys": (dict(T=1.0, top_p=0.9), True)}


@dataclass
class Inputs:
    x: np.ndarray        # [N, L, 6]
    x_stamp: np.ndarray  # [N, L, 5]
    y_stamp: np.ndarray  # [N, P, 5]
    keys: np.ndarray     # [N] int64 series keys


def make_inputs(count: int, lookback: int, pred_len: int, seed: int) -> Inputs:
    frames = synthetic_series(count, lookback + pred_len, seed=seed)
    x = np.stack([f[list(FEATURE_COLUMNS)].to_numpy(np.float32)[:lookback] for f in frames])
    ns = np.stack([wall_clock_ns(f["timestamps"]) for f in frames])
    keys = np.array([series_key(f"S{i:05d}", int(ns[i, lookback - 1])) for i in range(count)], dtype=np.int64)
    return Inputs(x, calendar_features_ns(ns[:, :lookback]), calendar_features_ns(ns[:, lookback:]), keys)


class TokenRecorder:
    """Records the tokens each `generate_call` of `predictor` generates, without its padding rows."""

    def __init__(self, predictor: KronosPredictor):
        self.predictor, self.calls = predictor, []
        self._pending: list[torch.Tensor] = []

    def __enter__(self) -> TokenRecorder:
        self._generate_tokens = predictor_module.generate_tokens
        self._generate_call = self.predictor.generate_call

        def generate_tokens(*args, **kwargs):
            new_s1, new_s2 = self._generate_tokens(*args, **kwargs)
            self._pending.append(torch.stack([new_s1, new_s2], dim=-1))
            return new_s1, new_s2

        def generate_call(x_norm, stamps, pred_len, params, sample_count, *args, **kwargs):
            paths = self._generate_call(x_norm, stamps, pred_len, params, sample_count, *args, **kwargs)
            self.calls.append(self._pending.pop()[:x_norm.shape[0] * sample_count].clone())
            return paths

        predictor_module.generate_tokens = generate_tokens
        self.predictor.generate_call = generate_call
        return self

    def __exit__(self, *exc) -> None:
        predictor_module.generate_tokens = self._generate_tokens
        del self.predictor.generate_call

    def tokens(self) -> np.ndarray:
        return torch.cat(self.calls).numpy()


def predict(predictor: KronosPredictor, inputs: Inputs, order: np.ndarray, max_batch_size: int,
            sampling: dict, keyed: bool, sample_count: int) -> tuple[np.ndarray, np.ndarray]:
    """(values [N, S, P, 6], tokens [N, S, P, 2]) in the original series order, computed in `order`."""
    with TokenRecorder(predictor) as recorder:
        values = predictor.predict_arrays(inputs.x[order], inputs.x_stamp[order], inputs.y_stamp[order],
                                          sample_count=sample_count, max_batch_size=max_batch_size * sample_count,
                                          keys=inputs.keys[order] if keyed else None, **sampling)
    tokens = recorder.tokens().reshape(len(order), sample_count, -1, 2)
    back = np.argsort(order)
    return values[back], tokens[back]


def invariance(args: argparse.Namespace) -> None:
    inputs = make_inputs(args.series, args.lookback, args.pred_len, args.seed)
    count = args.series
    forward, reverse = np.arange(count), np.arange(count)[::-1].copy()
    compositions = {name: layout for name, layout in
                    {"reversed": (reverse, count), "calls-of-7": (forward, 7), "alone": (forward, 1)}.items()
                    if name in args.compositions.split(",")}
    print(f"invariance: {count} series, lookback {args.lookback}, pred_len {args.pred_len}, "
          f"{args.sample_count} path(s), {torch.get_num_threads()} thread(s); reference: one batch of all")
    print(f"{'size':<6} {'mode':<16} {'composition':<12} {'series w/ token change':>23} {'tokens changed':>15} "
          f"{'series w/ value change':>23} {'max |diff|':>11}")
    for size in args.sizes.split(","):
        predictor = KronosPredictor(build_model(size, seed=args.seed), build_tokenizer(size, seed=args.seed + 1),
                                    device="cpu")
        for mode in args.modes.split(","):
            sampling, keyed = MODES[mode.strip()]
            values, tokens = predict(predictor, inputs, forward, count, sampling, keyed, args.sample_count)
            for name, (order, per_call) in compositions.items():
                other_values, other_tokens = predict(predictor, inputs, order, per_call, sampling, keyed,
                                                     args.sample_count)
                token_series = int((tokens != other_tokens).reshape(count, -1).any(axis=1).sum())
                token_share = float((tokens != other_tokens).mean())
                value_series = int((values != other_values).reshape(count, -1).any(axis=1).sum())
                diff = float(np.abs(values - other_values).max())
                print(f"{size:<6} {mode.strip():<16} {name:<12} {token_series:>14} of {count:<6} "
                      f"{token_share:>15.2e} {value_series:>14} of {count:<6} {diff:>11.3g}", flush=True)


def _timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def paired(name: str, plain: Callable[[], object], keyed: Callable[[], object], repeats: int) -> None:
    """Time `plain` and `keyed` in interleaved pairs (alternating which goes first); print one line."""
    plain(), keyed()  # warm-up: allocator growth, first-call dispatch
    times: dict[str, list[float]] = {"global": [], "streams": []}
    for repeat in range(repeats):
        pair = [("global", plain), ("streams", keyed)]
        for label, run in pair if repeat % 2 == 0 else pair[::-1]:
            times[label].append(_timed(run))
    ratios = [k / p for k, p in zip(times["streams"], times["global"])]
    cells = "  ".join(f"{label} {statistics.median(t) * 1e3:.2f} ms [{min(t) * 1e3:.2f}-{max(t) * 1e3:.2f}]"
                      for label, t in times.items())
    print(f"{name:<22} {cells}  ratio {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] "
          f"({repeats} pairs)", flush=True)


def cost(args: argparse.Namespace) -> None:
    model = build_model("mini", seed=args.seed).eval()
    rows, history, steps = args.rows, args.lookback, args.cost_steps
    generator = torch.Generator().manual_seed(args.seed)
    s1 = torch.randint(0, 2 ** model.s1_bits, (rows, history), generator=generator)
    s2 = torch.randint(0, 2 ** model.s2_bits, (rows, history), generator=generator)
    stamps = torch.rand(rows, history + steps, 5, generator=generator)
    params = SamplingParams(temperature=1.0, top_p=0.9)
    keys = torch.arange(rows, dtype=torch.int64)
    print(f"cost: mini, {rows} rows, history {history}, {steps} steps, {torch.get_num_threads()} thread(s); "
          f"T 1.0, top-p 0.9; times per call")

    def decode(streams: bool) -> Callable[[], object]:
        def run():
            with torch.inference_mode():
                return generate_tokens(model, s1, s2, stamps, steps, 2048, params,
                                       streams=RowStreams(args.seed, keys, 1) if streams else None)
        return run

    paired("decode (generate)", decode(False), decode(True), args.repeats)
    logits = torch.randn(rows, 2 ** model.s1_bits, generator=generator) * 3
    streams = RowStreams(args.seed, keys, 1)
    calls = 50

    def sampling(use_streams: bool) -> Callable[[], object]:
        def run():
            for _ in range(calls):
                sample_tokens(logits, params, streams=streams if use_streams else None)
        return run

    paired(f"sampling x{calls}", sampling(False), sampling(True), args.repeats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.predict_streams", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["invariance", "cost"], default=None, help="one part (default: both)")
    parser.add_argument("--sizes", default="mini,small", help="model sizes for the invariance part")
    parser.add_argument("--modes", default=",".join(MODES), help=f"sampling modes, of: {', '.join(MODES)}")
    parser.add_argument("--compositions", default="reversed,calls-of-7,alone",
                        help="compared with one batch of all, of: reversed, calls-of-7, alone")
    parser.add_argument("--series", type=int, default=1000)
    parser.add_argument("--lookback", type=int, default=32)
    parser.add_argument("--pred-len", type=int, default=4)
    parser.add_argument("--sample-count", type=int, default=1)
    parser.add_argument("--rows", type=int, default=256, help="rows of the cost part")
    parser.add_argument("--cost-steps", type=int, default=16, help="generated steps of the cost part")
    parser.add_argument("--repeats", type=int, default=9, help="interleaved pairs of the cost part")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="intra-op CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.only in (None, "invariance"):
        invariance(args)
    if args.only in (None, "cost"):
        cost(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
