"""Would int8 pay on this CPU? Dynamic int8 quantization of the model's Linear layers against float32 predict.

    python -m benchmarks.predict_int8 --size small --series 8 --lookback 400 --pred-len 30 --repeats 7
    python -m benchmarks.predict_int8 --arms fp32,int8,bf16-autocast,bf16-weights

A developer benchmark, no product option: torch's eager dynamic quantization (torch.ao.quantization.
quantize_dynamic) is deprecated in favour of torchao; the output says whether it is deprecated or missing in the
torch that runs. Every arm predicts the same synthetic series with the same random weights of `--size`
(greedy, top-k 1) in this one process: each arm's first call is reported apart, then `--repeats` rounds, each
running every arm once in an order rotated per round (interleaved, so a drifting machine moves every arm
alike). Per arm: the median and the range of its steady calls, and the median and range of its per-round time
ratio to float32 (below 1 is faster); its agreement with float32: the share of identical greedy tokens and the
forecast's max relative difference on the close. The first line names the CPU's flags (kronos_core.cpu_features).
Timings on a shared machine say little: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch

from benchmarks.predict import _series_inputs
from kronos_core.cpu_features import detect_cpu_features
from kronos_core.predict.predictor import KronosPredictor
from kronos_core.sizes import build_model, build_tokenizer

ARMS = ("fp32", "int8", "bf16-autocast", "bf16-weights")


def quantize_int8(model: torch.nn.Module) -> tuple[torch.nn.Module | None, str]:
    """(the model with its Linear layers quantized to int8, or None; what torch said about the API)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            from torch.ao.quantization import quantize_dynamic
        except ImportError as error:
            return None, f"torch {torch.__version__}: quantize_dynamic is not available ({error}); see torchao"
        quantized = quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    notices = [str(w.message).strip().splitlines()[0].rstrip() for w in caught if "deprecat" in str(w.message).lower()]
    engine = torch.backends.quantized.engine
    if notices:
        return quantized, f"torch {torch.__version__} (engine {engine}): deprecated: {notices[0]}"
    return quantized, f"torch {torch.__version__} (engine {engine}): available, no deprecation notice"


def build_arms(names: list[str], size: str) -> tuple[dict[str, KronosPredictor], list[str]]:
    model, tokenizer = build_model(size, seed=0).eval(), build_tokenizer(size, seed=1).eval()
    arms: dict[str, KronosPredictor] = {}
    notes: list[str] = []
    for name in names:
        if name == "fp32":
            arms[name] = KronosPredictor(model, tokenizer, device="cpu")
        elif name == "int8":
            quantized, status = quantize_int8(model)
            notes.append(f"int8: {status}")
            if quantized is not None:
                arms[name] = KronosPredictor(quantized, tokenizer, device="cpu")
        elif name == "bf16-autocast":
            arms[name] = KronosPredictor(model, tokenizer, device="cpu", amp="bf16")
        elif name == "bf16-weights":
            arms[name] = KronosPredictor(model, tokenizer, device="cpu", weight_dtype="bf16")
    return arms, notes


def timed_call(predictor: KronosPredictor, call: Callable[[KronosPredictor], list]) -> tuple[float, list]:
    start = time.perf_counter()
    with torch.inference_mode():
        frames = call(predictor)
    return time.perf_counter() - start, frames


def first_call_with_tokens(predictor: KronosPredictor, call) -> tuple[float, list, np.ndarray]:
    tokens: list[np.ndarray] = []
    predictor.token_sink = lambda s1, s2: tokens.append(np.stack([s1.numpy(), s2.numpy()], axis=-1))
    try:
        seconds, frames = timed_call(predictor, call)
    finally:
        predictor.token_sink = None
    return seconds, frames, np.concatenate(tokens)


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f} (range {min(values):.3f} to {max(values):.3f}, n={len(values)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.predict_int8", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="small")
    parser.add_argument("--series", type=int, default=8)
    parser.add_argument("--lookback", type=int, default=400)
    parser.add_argument("--pred-len", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds after each arm's first call")
    parser.add_argument("--arms", default="fp32,int8", help=f"comma-separated, fp32 first: {', '.join(ARMS)}")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0, help="of the synthetic series")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.arms.split(",") if name.strip()]
    if not names or names[0] != "fp32" or set(names) - set(ARMS) or args.repeats < 1:
        parser.error(f"--arms must start with fp32 and name only {', '.join(ARMS)}; --repeats at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"CPU: {detect_cpu_features().summary()}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"Kronos-{args.size} (random weights), {args.series} series x {args.lookback}/{args.pred_len}, greedy")
    arms, notes = build_arms(names, args.size)
    for note in notes:
        print(note)
    dfs, xs, ys = _series_inputs(args.series, args.lookback, args.pred_len, None, args.seed)

    def call(predictor: KronosPredictor) -> list:
        return predictor.predict_batch(dfs, xs, ys, args.pred_len, top_k=1, verbose=False)

    first: dict[str, tuple[float, list, np.ndarray]] = {name: first_call_with_tokens(p, call)
                                                        for name, p in arms.items()}
    order = list(arms)
    seconds: dict[str, list[float]] = {name: [] for name in order}
    for round_index in range(args.repeats):
        shift = round_index % len(order)
        for name in order[shift:] + order[:shift]:
            seconds[name].append(timed_call(arms[name], call)[0])
    _, reference_frames, reference_tokens = first["fp32"]
    for name in order:
        first_s, frames, tokens = first[name]
        line = f"{name}: first call {first_s:.3f} s; steady {spread(seconds[name])} s"
        line += f"; {args.series / statistics.median(seconds[name]):.2f} series/s"
        if name != "fp32":
            ratios = [mine / theirs for mine, theirs in zip(seconds[name], seconds["fp32"])]
            same = float(np.all(tokens == reference_tokens, axis=-1).mean())
            relative = max(float(np.max(np.abs(a["close"].to_numpy() - b["close"].to_numpy())
                                        / np.abs(b["close"].to_numpy()))) for a, b in zip(frames, reference_frames))
            line += (f"; time / fp32 per round {spread(ratios)}; {100 * same:.1f}% identical greedy tokens, "
                     f"close max relative difference {100 * relative:.2g}%")
        print(line)
    if "int8" in arms:
        ratios = [mine / theirs for mine, theirs in zip(seconds["int8"], seconds["fp32"])]
        pays = max(ratios) < 1
        print(f"verdict: int8 {'pays' if pays else 'does not pay'} on this CPU at this shape (time / fp32 "
              f"median {statistics.median(ratios):.3f}, {'every' if pays else 'not every'} round faster)")
    elif "int8" in names:
        print("verdict: int8 not measured: torch's dynamic quantization is not available here")
    return 0


if __name__ == "__main__":
    sys.exit(main())
