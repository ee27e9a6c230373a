"""Tests for kronos_core.data.dataset."""

from __future__ import annotations

import gc
import itertools
import pickle

import numpy as np
import pandas as pd
import pytest
import torch

from kronos_core.data.kline import FEATURE_COLUMNS, calendar_features
from kronos_core.data.dataset import KlineEvalDataset, KlineWindowDataset, split_frames
from kronos_core.errors import KronosError
from kronos_core.data.synthetic import synthetic_kline, synthetic_series

LOOKBACK, PREDICT = 32, 8
L = LOOKBACK + PREDICT + 1


@pytest.fixture(scope="module")
def frames() -> list[pd.DataFrame]:
    # Lengths 60, 30 (too short: no windows) and 100 -> 20 + 0 + 60 windows.
    sizes = (60, 30, 100)
    return [synthetic_kline(n, seed=i, start_price=5.0 + 10 * i) for i, n in enumerate(sizes)]


def make(frames, samples: int = 50, **kwargs) -> KlineWindowDataset:
    return KlineWindowDataset(frames, LOOKBACK, PREDICT, samples_per_epoch=samples, **kwargs)


def test_length_shapes_dtypes(frames) -> None:
    ds = make(frames, samples=17)
    assert len(ds) == 17 and ds.num_windows == 20 + 60 and ds.window_length == L
    x, stamp = ds[0]
    assert x.shape == (L, 6) and stamp.shape == (L, 5)
    assert x.dtype == torch.float32 and stamp.dtype == torch.float32
    with pytest.raises(IndexError):
        ds[17]


def test_items_match_source_rows(frames) -> None:
    ds = make(frames, samples=80, clip=1e9)
    used = set()
    for idx in range(len(ds)):
        series, start = ds.window_location(idx)
        used.add((series, start))
        assert series in (0, 2)
        raw = frames[series].iloc[start : start + L]
        x, stamp = ds[idx]
        np.testing.assert_array_equal(stamp.numpy(), calendar_features(raw["timestamps"]))
        values = raw[list(FEATURE_COLUMNS)].to_numpy(dtype=np.float32)
        mean, std = values[:LOOKBACK].mean(axis=0), values[:LOOKBACK].std(axis=0)
        np.testing.assert_allclose(x.numpy(), (values - mean) / (std + 1e-5), rtol=1e-4, atol=1e-4)
    # samples_per_epoch == number of windows: every window exactly once.
    assert len(used) == 80


def test_zscore_uses_lookback_rows_only() -> None:
    # A strong trend makes the prediction rows sit far from the lookback mean.
    df = synthetic_kline(200, seed=4, drift=0.5, volatility=0.01)
    ds = KlineWindowDataset([df], LOOKBACK, PREDICT, samples_per_epoch=10, clip=1e9)
    for idx in range(len(ds)):
        x = ds[idx][0].numpy()
        np.testing.assert_allclose(x[:LOOKBACK].mean(axis=0), 0.0, atol=1e-3)
        np.testing.assert_allclose(x[:LOOKBACK].std(axis=0), 1.0, atol=1e-3)
        # The whole window is not centred: stats did not come from all rows.
        assert abs(float(x[:, 3].mean())) > 0.05


def test_clip_applied(frames) -> None:
    ds = make(frames, samples=80, clip=0.5)
    assert max(float(ds[i][0].abs().max()) for i in range(len(ds))) <= 0.5


def test_same_seed_epoch_idx_same_item(frames) -> None:
    a, b = make(frames, seed=3), make(frames, seed=3)
    for ds in (a, b):
        ds.set_epoch(2)
    for idx in (0, 7, 49):
        assert a.window_location(idx) == b.window_location(idx)
        torch.testing.assert_close(a[idx], b[idx], rtol=0, atol=0)
    # Reading in any order, or after another epoch, gives the same item.
    first = a[7]
    a.set_epoch(5)
    a[3]
    a.set_epoch(2)
    torch.testing.assert_close(a[7], first, rtol=0, atol=0)


def test_epoch_and_seed_change_the_draw(frames) -> None:
    ds = make(frames, samples=50)
    epoch0 = [ds.window_location(i) for i in range(50)]
    ds.set_epoch(1)
    epoch1 = [ds.window_location(i) for i in range(50)]
    assert epoch0 != epoch1
    other = make(frames, samples=50, seed=1)
    assert [other.window_location(i) for i in range(50)] != epoch0
    assert len(set(epoch0)) == 50  # fewer samples than windows: no repeats


def test_more_samples_than_windows_cycles(frames) -> None:
    ds = make(frames, samples=200)
    order = ds.epoch_order()
    assert len(order) == 200
    counts = np.bincount(order, minlength=ds.num_windows)
    assert counts.min() >= 2 and counts.max() <= 3
    assert sorted(order[:80].tolist()) == list(range(80))  # first round is a permutation


def test_ram_and_memmap_identical(frames, tmp_path) -> None:
    ram = make(frames, samples=30, seed=9)
    mm = make(frames, samples=30, seed=9, preload="memmap", memmap_dir=tmp_path)
    files = list(tmp_path.glob("*.npy"))
    assert len(files) == 1
    assert isinstance(np.load(files[0], mmap_mode="r"), np.memmap)
    for ds in (ram, mm):
        ds.set_epoch(1)
    for idx in range(30):
        torch.testing.assert_close(ram[idx], mm[idx], rtol=0, atol=0)
    del mm, ds
    gc.collect()
    assert not list(tmp_path.glob("*.npy"))  # the builder removes its file


def test_memmap_pickles_small_and_reopens(frames) -> None:
    mm = make(frames, samples=30, preload="memmap")
    mm[0]  # opens the map
    blob = pickle.dumps(mm)
    assert len(blob) < 10_000  # the rows are not inside the pickle
    clone = pickle.loads(blob)
    for idx in (0, 29):
        torch.testing.assert_close(clone[idx], mm[idx], rtol=0, atol=0)


def test_dataloader_batches(frames) -> None:
    loader = torch.utils.data.DataLoader(make(frames, samples=12), batch_size=4)
    batches = list(loader)
    assert len(batches) == 3
    x, stamp = batches[0]
    assert x.shape == (4, L, 6) and stamp.shape == (4, L, 5)


def test_frames_without_volume_are_filled(frames) -> None:
    prices_only = [f.drop(columns=["volume", "amount"]) for f in frames]
    ds = make(prices_only, samples=5)
    x = ds[0][0]
    assert (x[:, 4:] == 0).all()  # volume/amount set to 0, normalized to 0


def test_too_short_data_error(frames) -> None:
    with pytest.raises(KronosError, match=rf"need at least {L} rows.*longest series has 30 rows"):
        make([frames[1], frames[1].iloc[:10]])
    with pytest.raises(KronosError, match="no series"):
        make([])


def test_bad_arguments_and_bad_frames(frames) -> None:
    with pytest.raises(KronosError, match="samples_per_epoch"):
        make(frames, samples=0)
    with pytest.raises(KronosError, match="preload"):
        make(frames, preload="disk")
    with pytest.raises(KronosError, match="lookback"):
        KlineWindowDataset(frames, 0, PREDICT, 5)
    bad = frames[2].copy()
    bad.loc[50, "close"] = np.nan
    with pytest.raises(KronosError, match=r"series 1: column 'close' has NaN"):
        make([frames[0], bad])


def test_eval_dataset_deterministic_and_even(frames) -> None:
    ev = KlineEvalDataset(frames, LOOKBACK, PREDICT, max_windows=9)
    again = KlineEvalDataset(frames, LOOKBACK, PREDICT, max_windows=9)
    assert len(ev) == 9
    assert ev.windows.tolist() == [0, 10, 20, 30, 40, 49, 59, 69, 79]
    assert ev.window_location(0) == (0, 0) and ev.window_location(8) == (2, 59)
    for idx in range(len(ev)):
        torch.testing.assert_close(ev[idx], again[idx], rtol=0, atol=0)
    everything = KlineEvalDataset(frames, LOOKBACK, PREDICT, max_windows=1000)
    assert len(everything) == 80
    with pytest.raises(IndexError):
        ev[9]


def test_split_frames_in_time() -> None:
    frames = synthetic_series(2, n_rows=100, seed=1) + [synthetic_kline(300, seed=9)]
    train, val = split_frames(frames, val_fraction=0.2)
    assert [len(t) for t in train] == [80, 80, 240] and [len(v) for v in val] == [20, 20, 60]
    for full, t, v in zip(frames, train, val):
        assert t["timestamps"].iloc[-1] < v["timestamps"].iloc[0]
        pd.testing.assert_frame_equal(pd.concat([t, v], ignore_index=True), full)
        assert v.index[0] == 0


def test_split_frames_keeps_one_val_window_where_possible() -> None:
    frames = [synthetic_kline(100, seed=1), synthetic_kline(60, seed=2)]
    train, val = split_frames(frames, val_fraction=0.2, min_val_rows=L)
    assert len(val[0]) == L and len(train[0]) == 100 - L  # grown from 20 rows
    assert len(val[1]) == 12  # 60 < 2 * L: plain 20% split
    KlineEvalDataset(val, LOOKBACK, PREDICT)  # has a window
    with pytest.raises(KronosError, match="val_fraction"):
        split_frames(frames, val_fraction=1.0)


def test_compiled_runs_start_loader_workers_from_a_forkserver_and_read_the_same_batches() -> None:
    """Forking a process whose compile threads hold locks can hang the child: with compile, workers start
    from a clean forkserver process, and the batches are the same as in the main process."""
    from kronos_core.train import TrainConfig
    from kronos_core.train.loading import GlobalBatchSampler, build_datasets, eval_loader, train_loader

    base = dict(model_size="tiny", lookback_window=16, predict_window=4, batch_size=4, samples_per_epoch=16,
                eval_samples=8, device="cpu", synthetic_series=2, synthetic_rows=200)
    plain = TrainConfig(**base)
    compiled = TrainConfig(**base, compile="default", num_workers=2)
    train_set, val_set = build_datasets(plain)
    loaders = {}
    for name, config in (("plain", plain), ("compiled", compiled)):
        sampler = GlobalBatchSampler(config.samples_per_epoch, config.batch_size, 1, 1, 0)
        loaders[name] = (train_loader(train_set, config, sampler), eval_loader(val_set, config, 1, 0))
    assert loaders["compiled"][0].multiprocessing_context.get_start_method() == "forkserver"
    assert loaders["compiled"][1].multiprocessing_context.get_start_method() == "forkserver"
    assert loaders["plain"][0].multiprocessing_context is None
    try:
        for index in (0, 1):  # the training sampler is endless: its first 4 micro-batches
            pairs = list(itertools.islice(zip(loaders["plain"][index], loaders["compiled"][index]), 4))
            assert pairs
            for (x_a, s_a), (x_b, s_b) in pairs:
                assert torch.equal(x_a, x_b) and torch.equal(s_a, s_b)
    finally:
        loaders.clear()  # the persistent workers shut down with their loaders
        gc.collect()
        import multiprocessing.forkserver

        import multiprocessing.resource_tracker

        # the server and its resource tracker would outlive the test as children of the test process
        multiprocessing.forkserver._forkserver._stop()
        multiprocessing.resource_tracker._resource_tracker._stop()
