"""KronosPredictor and token generation: cache exactness, batching, chunking, inputs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from kronos_core.data.kline import read_kline
from kronos_core.errors import KronosError
from kronos_core.predict.generation import SamplingParams, generate_tokens, sample_tokens
from kronos_core.layers import LayerCache
from kronos_core.predict.predictor import KronosPredictor
from kronos_core.sizes import build_model, build_tokenizer
from kronos_core.data.synthetic import synthetic_kline, synthetic_series

COLUMNS = ["open", "high", "low", "close", "volume", "amount"]


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny", seed=1), build_tokenizer("tiny", seed=2)


def _split(frame: pd.DataFrame, lookback: int, pred_len: int):
    history = frame.iloc[-(lookback + pred_len):-pred_len] if pred_len else frame.iloc[-lookback:]
    future = frame["timestamps"].iloc[-pred_len:]
    return history[COLUMNS].reset_index(drop=True), history["timestamps"].reset_index(drop=True), \
        future.reset_index(drop=True)


def _batch(frames, lookback, pred_len):
    parts = [_split(f, lookback, pred_len) for f in frames]
    return [p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts]


def _stamps(batch, length):
    g = torch.Generator().manual_seed(5)
    return torch.stack([torch.randint(0, h, (batch, length), generator=g) for h in (60, 24, 7, 32, 13)], -1).float()


@pytest.mark.parametrize("history,context", [(256, 512), (500, 512)])
def test_greedy_cached_equals_full_recompute(tiny, history, context):
    model = tiny[0].eval()
    g = torch.Generator().manual_seed(history)
    s1 = torch.randint(0, 1024, (3, history), generator=g)
    s2 = torch.randint(0, 1024, (3, history), generator=g)
    stamps = _stamps(3, history + 30)
    greedy = SamplingParams(top_k=1)
    with torch.inference_mode():
        plain = generate_tokens(model, s1, s2, stamps, 30, context, greedy, use_cache=False)
        cached = generate_tokens(model, s1, s2, stamps, 30, context, greedy, use_cache=True)
    assert torch.equal(plain[0], cached[0]) and torch.equal(plain[1], cached[1])


def test_shift_mode_is_exact_until_the_window_slides(tiny):
    model = tiny[0].eval()
    s1 = torch.randint(0, 1024, (2, 40))
    s2 = torch.randint(0, 1024, (2, 40))
    stamps = _stamps(2, 60)
    greedy = SamplingParams(top_k=1)
    with torch.inference_mode():
        exact = generate_tokens(model, s1, s2, stamps, 20, 50, greedy, use_cache=True)
        shifted = generate_tokens(model, s1, s2, stamps, 20, 50, greedy, use_cache=True, window_mode="shift")
    # Steps 0..10 see windows that start at position 0 in both modes.
    assert torch.equal(exact[0][:, :11], shifted[0][:, :11])
    assert shifted[0].shape == (2, 20)


def test_sliding_cache_is_a_ring_that_attends_like_the_last_positions_in_order():
    cache = LayerCache(batch=2, n_heads=3, head_dim=4, capacity=5, device=torch.device("cpu"), dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    history_k, history_v = torch.randn(2, 3, 4, 4, generator=g), torch.randn(2, 3, 4, 4, generator=g)
    cache.append(history_k, history_v)
    chronological = [(history_k[:, :, i:i + 1], history_v[:, :, i:i + 1]) for i in range(4)]
    for step in range(9):  # fills the last slot, then wraps around the ring almost twice
        if cache.length == cache.capacity:
            cache.drop_oldest()
            chronological.pop(0)
        k, v = torch.randn(2, 3, 1, 4, generator=g), torch.randn(2, 3, 1, 4, generator=g)
        chronological.append((k, v))
        ring_k, ring_v = cache.append(k, v)
        in_order_k = torch.cat([pair[0] for pair in chronological], dim=2)
        in_order_v = torch.cat([pair[1] for pair in chronological], dim=2)
        q = torch.randn(2, 3, 1, 4, generator=g)
        torch.testing.assert_close(F.scaled_dot_product_attention(q, ring_k, ring_v),
                                   F.scaled_dot_product_attention(q, in_order_k, in_order_v))
    assert cache.next_position == 4 + 9 and cache.dropped == 8 and cache.length == 5
    cache.drop_oldest(1)
    with pytest.raises(RuntimeError, match="has a gap"):
        cache.view()  # the dropped slot sits between the newest and the oldest position
    cache.append(torch.zeros(2, 3, 1, 4), torch.zeros(2, 3, 1, 4))
    cache.drop_oldest(2)
    with pytest.raises(RuntimeError, match="cannot wrap"):  # only single tokens go round the ring
        cache.append(torch.zeros(2, 3, 2, 4), torch.zeros(2, 3, 2, 4))


def test_sampling_rules():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    assert sample_tokens(logits, SamplingParams(top_k=1)).item() == 1
    torch.manual_seed(0)
    draws = {sample_tokens(logits, SamplingParams(top_k=2)).item() for _ in range(200)}
    assert draws == {1, 3}
    nucleus = {sample_tokens(logits, SamplingParams(top_k=0, top_p=0.5)).item() for _ in range(200)}
    assert nucleus == {1}  # the top token alone already holds more than half the mass
    with pytest.raises(ValueError):
        SamplingParams(temperature=0)


def test_predict_returns_frames_indexed_by_future_timestamps(tiny):
    frame = synthetic_kline(300, seed=4)
    df, x_ts, y_ts = _split(frame, 200, 24)
    predictor = KronosPredictor(*tiny, device="cpu")
    result = predictor.predict(df, x_ts, y_ts, pred_len=24, verbose=False)
    assert list(result.columns) == COLUMNS
    assert list(result.index) == list(y_ts)
    assert result.to_numpy().dtype == np.float32 and np.isfinite(result.to_numpy()).all()
    assert not predictor.model.training and not predictor.tokenizer.training


def test_sample_paths_shape_and_mean(tiny):
    frame = synthetic_kline(200, seed=5)
    df, x_ts, y_ts = _split(frame, 120, 10)
    predictor = KronosPredictor(*tiny, device="cpu")
    torch.manual_seed(0)
    mean, paths = predictor.predict(df, x_ts, y_ts, 10, sample_count=4, verbose=False, return_samples=True)
    assert paths.shape == (4, 10, 6)
    # The mean is taken in normalized space; de-normalizing is affine, so it commutes.
    assert np.allclose(paths.mean(axis=0), mean.to_numpy(), rtol=1e-4, atol=1e-3)
    assert not np.allclose(paths[0], paths[1])


def test_tokenizer_encodes_each_series_once_not_each_sample(tiny):
    model, tokenizer = tiny
    frames = synthetic_series(3, 150, seed=6)
    predictor = KronosPredictor(model, tokenizer, device="cpu")
    seen_batches = []
    handle = predictor.tokenizer.quant_embed.register_forward_hook(lambda m, i, o: seen_batches.append(o.shape[0]))
    try:
        predictor.predict_batch(*_batch(frames, 100, 5), pred_len=5, sample_count=4, verbose=False)
    finally:
        handle.remove()
    assert seen_batches == [3]


def test_batch_of_one_equals_predict(tiny):
    frame = synthetic_kline(260, seed=7)
    df, x_ts, y_ts = _split(frame, 200, 16)
    predictor = KronosPredictor(*tiny, device="cpu")
    single = predictor.predict(df, x_ts, y_ts, 16, top_k=1, verbose=False)
    batch = predictor.predict_batch([df], [x_ts], [y_ts], 16, top_k=1, verbose=False)
    pd.testing.assert_frame_equal(single, batch[0])


def test_chunked_equals_unchunked_and_lengths_may_differ(tiny):
    frames = synthetic_series(5, 260, seed=8)
    dfs, xs, ys = _batch(frames, 200, 12)
    # Two series with a shorter history: grouped by length, not truncated.
    for i in (1, 3):
        dfs[i], xs[i] = dfs[i].iloc[50:].reset_index(drop=True), xs[i].iloc[50:].reset_index(drop=True)
    predictor = KronosPredictor(*tiny, device="cpu")
    whole = predictor.predict_batch(dfs, xs, ys, 12, top_k=1, verbose=False, max_batch_size=64)
    chunked = predictor.predict_batch(dfs, xs, ys, 12, top_k=1, verbose=False, max_batch_size=2)
    alone = [predictor.predict(d, x, y, 12, top_k=1, verbose=False) for d, x, y in zip(dfs, xs, ys)]
    for a, b, c in zip(whole, chunked, alone):
        pd.testing.assert_frame_equal(a, b)
        np.testing.assert_allclose(a.to_numpy(), c.to_numpy(), rtol=1e-5, atol=1e-4)


def test_cached_and_uncached_predictor_agree(tiny):
    frames = synthetic_series(2, 140, seed=9)
    args = _batch(frames, 100, 15)
    cached = KronosPredictor(*tiny, device="cpu").predict_batch(*args, 15, top_k=1, verbose=False)
    plain = KronosPredictor(*tiny, device="cpu", use_cache=False).predict_batch(*args, 15, top_k=1, verbose=False)
    for a, b in zip(cached, plain):
        pd.testing.assert_frame_equal(a, b)


def test_end_to_end_from_a_csv_the_test_writes(tiny, tmp_path):
    path = tmp_path / "stock.csv"
    frame = synthetic_kline(180, seed=10)
    frame[["close", "timestamps", "open", "volume", "high", "low"]].to_csv(path, index=False)  # no amount
    loaded = read_kline(path)
    df, x_ts, y_ts = _split(loaded, 150, 20)
    result = KronosPredictor(*tiny, device="cpu").predict(df, x_ts, y_ts, 20, verbose=False)
    assert result.shape == (20, 6) and np.isfinite(result.to_numpy()).all()


def test_bf16_autocast_runs_on_cpu(tiny):
    frame = synthetic_kline(120, seed=11)
    df, x_ts, y_ts = _split(frame, 100, 5)
    result = KronosPredictor(*tiny, device="cpu", amp="bf16").predict(df, x_ts, y_ts, 5, verbose=False)
    assert np.isfinite(result.to_numpy()).all()


def test_history_longer_than_context_warns_and_still_predicts(tiny):
    frame = synthetic_kline(120, seed=12)
    df, x_ts, y_ts = _split(frame, 100, 5)
    predictor = KronosPredictor(*tiny, device="cpu", max_context=64)
    with pytest.warns(UserWarning, match="longer than max_context=64"):
        result = predictor.predict(df, x_ts, y_ts, 5, verbose=False)
    assert result.shape == (5, 6)


@pytest.mark.parametrize("mutate,message", [
    (lambda df: df.drop(columns=["close"]), "missing price column"),
    (lambda df: df.assign(open=df["open"].where(df.index != 3, np.nan)), "NaN in column 'open' at row 3"),
    (lambda df: df.assign(high=df["high"].where(df.index != 7, np.inf)), "inf in column 'high' at row 7"),
])
def test_bad_frames_are_one_line_errors(tiny, mutate, message):
    frame = synthetic_kline(60, seed=13)
    df, x_ts, y_ts = _split(frame, 50, 5)
    with pytest.raises(KronosError, match=message):
        KronosPredictor(*tiny, device="cpu").predict(mutate(df), x_ts, y_ts, 5, verbose=False)


def test_wrong_number_of_future_timestamps(tiny):
    frame = synthetic_kline(60, seed=14)
    df, x_ts, y_ts = _split(frame, 50, 5)
    with pytest.raises(KronosError, match="y_timestamp has 5 entries but pred_len=6"):
        KronosPredictor(*tiny, device="cpu").predict(df, x_ts, y_ts, 6, verbose=False)
    assert issubclass(KronosError, ValueError)  # reference callers catch ValueError


@pytest.mark.parametrize("window_mode", ["refill", "shift"])
def test_static_cache_equals_the_growing_cache_across_the_slide(tiny, window_mode):
    model = tiny[0].eval()
    g = torch.Generator().manual_seed(11)
    s1 = torch.randint(0, 1024, (3, 40), generator=g)
    s2 = torch.randint(0, 1024, (3, 40), generator=g)
    stamps = _stamps(3, 70)
    greedy = SamplingParams(top_k=1)
    with torch.inference_mode():  # the window (50) slides after 10 of the 30 steps
        growing = generate_tokens(model, s1, s2, stamps, 30, 50, greedy, window_mode=window_mode)
        static = generate_tokens(model, s1, s2, stamps, 30, 50, greedy, window_mode=window_mode,
                                 decode_step="static")
    assert torch.equal(growing[0], static[0]) and torch.equal(growing[1], static[1])


def test_static_step_logits_match_and_masked_slots_do_not_matter(tiny):
    from kronos_core.predict.static_cache import StaticStep

    model = tiny[0].eval()
    g = torch.Generator().manual_seed(12)
    s1, s2 = torch.randint(0, 1024, (2, 12), generator=g), torch.randint(0, 1024, (2, 12), generator=g)
    stamps = _stamps(2, 12)
    with torch.inference_mode():
        growing, fixed = model.new_cache(2, 20, torch.device("cpu"), torch.float32), \
            model.new_cache(2, 20, torch.device("cpu"), torch.float32)
        for cache in (growing, fixed):
            model.extend_cache(s1[:, :11], s2[:, :11], stamps[:, :11], cache)
        for layer in (*fixed.layers, fixed.dep):  # garbage in the empty slots must be masked out
            layer.keys[:, :, 12:] = 1e4
            layer.values[:, :, 12:] = -1e4
        logits, hidden = model.extend_cache(s1[:, 11:], s2[:, 11:], stamps[:, 11:], growing)
        step = StaticStep(model, fixed, stamps.dtype, max_positions=32)
        static_logits, static_hidden = step.s1_step(s1[:, 11:], s2[:, 11:], stamps[:, 11:])
        torch.testing.assert_close(static_logits, logits)
        ids = logits.argmax(-1)
        torch.testing.assert_close(step.s2_logits(static_hidden, ids), model.s2_logits_cached(hidden, ids, growing))
    assert fixed.length == growing.length == 12


def test_a_new_cache_holds_zeros_not_what_the_allocator_left(tiny):
    # The static step attends over every slot with a mask: a masked weight is 0, but 0 x NaN is NaN, so a NaN
    # or inf left in an empty slot by earlier work (a freed -inf mask, say) would poison every step.
    model = tiny[0].eval()
    layer = model.new_cache(2, 20, torch.device("cpu"), torch.float32).layers[0]
    for _ in range(5):
        poison = torch.full(layer.keys.shape, float("nan"))
        del poison  # the allocator may hand this block to the next allocation of the same size
        cache = model.new_cache(2, 20, torch.device("cpu"), torch.float32)
        for part in (*cache.layers, cache.dep):
            assert torch.count_nonzero(part.keys) == 0 and torch.count_nonzero(part.values) == 0


def test_predictor_with_static_cache_equals_default(tiny):
    frames = synthetic_series(2, 90, seed=15)
    args = _batch(frames, 60, 12)
    default = KronosPredictor(*tiny, device="cpu", max_context=64)
    static = KronosPredictor(*tiny, device="cpu", max_context=64, static_cache=True, window_mode="refill")
    assert default.decode_step == "dynamic" and static.decode_step == "static"
    for a, b in zip(default.predict_batch(*args, 12, top_k=1, verbose=False),
                    static.predict_batch(*args, 12, top_k=1, verbose=False)):
        pd.testing.assert_frame_equal(a, b)
    with pytest.raises(KronosError, match="cuda_graphs=True needs a CUDA device"):
        KronosPredictor(*tiny, device="cpu", cuda_graphs=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("window_mode", ["refill", "shift"])
@pytest.mark.parametrize("amp", [None, "bf16"])
def test_cuda_graph_steps_equal_eager_steps(window_mode, amp):
    model, tokenizer = build_model("tiny", seed=1), build_tokenizer("tiny", seed=2)
    frames = synthetic_series(6, 110, seed=16)
    args = _batch(frames, 80, 30)  # max_context 96: the window slides after 16 of the 30 steps
    eager = KronosPredictor(model, tokenizer, device="cuda", max_context=96, amp=amp, window_mode=window_mode,
                            cuda_graphs=False, static_cache=True)
    graphs = KronosPredictor(model, tokenizer, device="cuda", max_context=96, amp=amp, window_mode=window_mode)
    assert graphs.decode_step == "graph"
    for _ in range(2):  # the second call captures fresh graphs for fresh caches
        for a, b in zip(eager.predict_batch(*args, 30, top_k=1, verbose=False),
                        graphs.predict_batch(*args, 30, top_k=1, verbose=False)):
            pd.testing.assert_frame_equal(a, b)


def test_progress_reaches_every_step_and_series_of_every_chunk(tiny):
    dfs, xs, ys = _batch([synthetic_kline(150, seed=s) for s in range(5)], 100, 7)
    reports = []
    KronosPredictor(*tiny, device="cpu").predict_batch(dfs, xs, ys, 7, top_k=1, max_batch_size=2,
                                                       on_progress=reports.append)
    steps = [r.steps_done for r in reports]
    series = [r.series_done for r in reports]
    assert steps == sorted(steps) and series == sorted(series)
    # five series in chunks of two: three chunks of seven steps
    assert {(r.steps_total, r.series_total) for r in reports} == {(21, 5)}
    assert steps[-1] == 21 and series[-1] == 5


def test_the_core_predicts_without_loading_any_ui_library():
    """kronos_core needs no UI library: importing it and predicting leaves rich, textual and typer unloaded."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import kronos_core\n"
        "from kronos_core.sizes import build_model, build_tokenizer\n"
        "from kronos_core.data.synthetic import synthetic_kline\n"
        "frame = synthetic_kline(120, seed=0)\n"
        "history, future = frame.iloc[:100], frame['timestamps'].iloc[100:110].reset_index(drop=True)\n"
        "predictor = kronos_core.KronosPredictor(build_model('tiny', seed=1), build_tokenizer('tiny', seed=2),"
        " device='cpu')\n"
        "out = predictor.predict(history.drop(columns='timestamps'), history['timestamps'], future, 10, top_k=1)\n"
        "assert len(out) == 10\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('rich', 'textual', 'typer', 'kronos_tune')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_weights_held_in_bf16_leave_the_callers_modules_and_stay_near_float32(tiny):
    model, tokenizer = tiny
    frames = [synthetic_kline(120, seed=seed) for seed in range(3)]
    dfs, xs, ys = _batch(frames, 100, 6)
    exact = KronosPredictor(model, tokenizer, device="cpu")
    held = KronosPredictor(model, tokenizer, device="cpu", weight_dtype="bf16")
    tokens: list[tuple[torch.Tensor, torch.Tensor]] = []
    held.token_sink = lambda s1, s2: tokens.append((s1, s2))
    reference = exact.predict_batch(dfs, xs, ys, 6, top_k=1, verbose=False)
    halved = held.predict_batch(dfs, xs, ys, 6, top_k=1, verbose=False)
    assert next(model.parameters()).dtype == torch.float32 and next(tokenizer.parameters()).dtype == torch.float32
    assert next(held.model.parameters()).dtype == torch.bfloat16 and held.amp == "bf16"
    assert [tuple(s1.shape) for s1, _ in tokens] == [(3, 6)] and tokens[0][1].shape == (3, 6)
    for mine, theirs in zip(halved, reference):
        assert np.isfinite(mine.to_numpy()).all()
        close = theirs["close"].to_numpy()
        assert np.max(np.abs(mine["close"].to_numpy() - close) / np.abs(close)) < 0.5  # same scale, not identical
    with pytest.raises(KronosError, match="weight_dtype='bf16' runs under bf16 autocast"):
        KronosPredictor(model, tokenizer, device="cpu", amp="fp16", weight_dtype="bf16")
