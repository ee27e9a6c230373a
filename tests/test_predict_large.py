"""`predict --out` as a job (kronos_tune.predict.large): chunks kept as they finish, resumed to the identical
output, refused with other settings, the same forecast whatever the input order; sorted Parquet panels read
in symbol batches. Real tiny models, in this process, sampled (T 1, top-p 0.9) unless said."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kronos_core.data.panels import read_panel
from kronos_core.data.synthetic import synthetic_kline
from kronos_tune.errors import KronosTuneError
from kronos_tune.predict.config import PredictConfig
from kronos_tune.predict.job import run_predict
from kronos_tune.predict.large import SMALL_RUN_SERIES
from kronos_core.data.panel_stream import sorted_panels, symbol_batches
from kronos_tune.predict.workdir import DoneChunk, open_work

BASE = dict(lookback=24, pred_len=2, size="tiny", device="cpu", chunk_series=3, sample_count=2)


def write_panel(path: Path, count: int, rows: int = 30, amount: bool = True, order: str = "sorted") -> None:
    parts = [synthetic_kline(rows + k % 3, seed=k).assign(Code=f"S{k:03d}") for k in range(count)]
    panel = pd.concat(parts, ignore_index=True)[["Code", "timestamps", "open", "high", "low", "close", "volume",
                                                 *(["amount"] if amount else [])]]
    if order == "shuffled":
        panel = panel.sample(frac=1.0, random_state=3)
    elif order == "reversed":
        panel = panel.iloc[::-1]
    if path.suffix == ".csv":
        panel.to_csv(path, index=False)
    else:
        panel.to_parquet(path, index=False)


def panel_config(data: Path, out: Path, **extra) -> PredictConfig:
    return PredictConfig(**{**BASE, "data": (data,), "symbol_column": "code", "out": out, **extra})


class StopAfter:
    """A planted fault between chunks: Ctrl-C after the n-th finished chunk (the job's own progress hook)."""

    def __init__(self, chunks: int) -> None:
        self.chunks, self.seen = chunks, 0

    def __call__(self, report) -> None:
        self.seen += 1
        if self.seen == self.chunks:
            raise KeyboardInterrupt


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_a_resumed_job_writes_what_an_uninterrupted_one_writes(tmp_path: Path, suffix: str) -> None:
    write_panel(tmp_path / "panel.parquet", 8)
    full = run_predict(panel_config(tmp_path / "panel.parquet", tmp_path / f"full{suffix}"))
    assert full.job["chunks"] == 3 and full.job["resumed_chunks"] == 0
    out = tmp_path / f"cut{suffix}"
    with pytest.raises(KronosTuneError, match=r"interrupted after 2 of about 3 chunks; the finished chunks are kept in "
                                              r".*cut.*\.work; run the same command with --resume"):
        run_predict(panel_config(tmp_path / "panel.parquet", out), on_job_progress=StopAfter(2))
    assert not out.exists() and len(list((tmp_path / f"cut{suffix}.work" / "done").iterdir())) == 2
    resumed = run_predict(panel_config(tmp_path / "panel.parquet", out, resume=True))
    assert resumed.job["resumed_chunks"] == 2 and resumed.series == 8
    assert out.read_bytes() == (tmp_path / f"full{suffix}").read_bytes()
    assert not (tmp_path / f"cut{suffix}.work").exists()  # removed once --out is written


def test_resume_refusals_name_what_differs(tmp_path: Path) -> None:
    write_panel(tmp_path / "panel.parquet", 5)
    out = tmp_path / "p.parquet"
    with pytest.raises(KronosTuneError, match=r"^--resume: no work folder .*p\.parquet\.work to continue"):
        run_predict(panel_config(tmp_path / "panel.parquet", out, resume=True))
    with pytest.raises(KronosTuneError, match="interrupted after 1 of about"):
        run_predict(panel_config(tmp_path / "panel.parquet", out), on_job_progress=StopAfter(1))
    with pytest.raises(KronosTuneError, match=r"holds an unfinished job \(1 chunks finished\); add --resume"):
        run_predict(panel_config(tmp_path / "panel.parquet", out))
    with pytest.raises(KronosTuneError, match=r"other data, model or settings \(seed: 0 there, 7 now; "
                                              r"top_p: 0.9 there, 0.5 now\)"):
        run_predict(panel_config(tmp_path / "panel.parquet", out, resume=True, seed=7, top_p=0.5))
    write_panel(tmp_path / "panel.parquet", 6)  # other data under the same name
    with pytest.raises(KronosTuneError, match=r"other data, model or settings \(data: "):
        run_predict(panel_config(tmp_path / "panel.parquet", out, resume=True))
    assert len(list((tmp_path / "p.parquet.work" / "done").iterdir())) == 1  # nothing finished was lost


def test_a_job_that_fails_before_any_chunk_leaves_no_work_folder(tmp_path: Path) -> None:
    write_panel(tmp_path / "panel.csv", 3, rows=10)
    with pytest.raises(KronosTuneError, match="use a shorter --lookback"):
        run_predict(panel_config(tmp_path / "panel.csv", tmp_path / "o.csv"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["panel.csv"]


def test_what_a_stopped_job_says_it_keeps_is_what_stays_on_disk(tmp_path: Path) -> None:
    out = tmp_path / "o.parquet"
    fresh = open_work(out, {"chunk_series": 2}, resume=False)
    # run_job removes a folder it created when no chunk had finished: the note must not point at it
    assert fresh.kept_note(resumable=True) == "no chunk had finished, so nothing is kept; run the same command again"
    joined = open_work(out, {"chunk_series": 2}, resume=False, join=True)  # another node created it: it stays
    assert joined.kept_note(resumable=True) == (f"no chunk had finished; run the same command with --resume to "
                                                f"start again from {joined.path}")
    fresh.part(0).write_bytes(b"part")
    fresh.record(DoneChunk(chunk=0, rank=0, series=2, rows=8, precision=(2, 0, 0), seconds=0.1))
    assert fresh.kept_note(resumable=True) == (f"the finished chunks are kept in {fresh.path}; run the same "
                                               f"command with --resume to finish")
    assert fresh.kept_note(resumable=False) == f"the finished chunks are kept in {fresh.path}"


def test_the_forecast_does_not_depend_on_row_order_or_file_format(tmp_path: Path) -> None:
    write_panel(tmp_path / "sorted.parquet", 7)
    write_panel(tmp_path / "shuffled.csv", 7, order="shuffled")
    write_panel(tmp_path / "reversed.parquet", 7, order="reversed")
    notes: list[str] = []
    outs = []
    for name in ("sorted.parquet", "shuffled.csv", "reversed.parquet"):
        outs.append(tmp_path / f"out-{name}.parquet")
        run_predict(panel_config(tmp_path / name, outs[-1]), on_note=lambda level, text: notes.append(text))
    first = pd.read_parquet(outs[0])
    for other in outs[1:]:
        pd.testing.assert_frame_equal(pd.read_parquet(other), first)
    assert list(first["Code"].unique()) == [f"S{k:03d}" for k in range(7)]  # name order, the file's column name
    assert any("reversed.parquet is not sorted by Code" in n and "read whole" in n for n in notes)
    assert any("a CSV panel cannot be read in symbol batches: the panel is read whole" in n for n in notes)


def test_symbol_batches_are_whole_symbols_and_read_like_the_whole_file(tmp_path: Path) -> None:
    write_panel(tmp_path / "panel.parquet", 9)
    panels, why = sorted_panels([tmp_path / "panel.parquet"], "code")
    assert panels is not None and panels.symbols == 9 and why == ""
    batches = list(symbol_batches(panels, "code", batch_rows=40))  # symbols of 30-32 rows: cut across batches
    assert len(batches) > 3
    assert all(set(a["symbol"]).isdisjoint(b["symbol"]) for a, b in zip(batches, batches[1:]))
    whole = read_panel(tmp_path / "panel.parquet", "code")
    joined = pd.concat(batches, ignore_index=True)
    pd.testing.assert_frame_equal(joined, whole.reset_index(drop=True), check_like=False)


def test_symbol_batches_do_not_keep_the_row_groups_they_have_read(tmp_path: Path) -> None:
    """Arrow memory while streaming a panel stays about a row group, not the file (pyarrow's pre-buffering
    kept every column chunk read until the end: about the file's compressed size, 2.35 GB for a million
    80-row symbols)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    count, rows = 1500, 40
    close = 50 * np.exp(np.cumsum(np.random.default_rng(0).normal(0, 0.01, (count, rows)), axis=1)).ravel()
    table = pa.table({"Code": np.repeat([f"S{k:05d}" for k in range(count)], rows),
                      "timestamps": np.tile(pd.bdate_range("2020-01-01", periods=rows).to_numpy(), count),
                      **{c: close * (1 + k / 1000) for k, c in enumerate(("open", "high", "low", "close"))}})
    path = tmp_path / "panel.parquet"
    pq.write_table(table, path, row_group_size=3000, compression="none")  # 20 row groups, about 2.4 MB
    panels, _ = sorted_panels([path], "code")
    assert panels is not None and panels.symbols == count
    before = pa.total_allocated_bytes()
    held = [pa.total_allocated_bytes() - before for _ in symbol_batches(panels, "code", batch_rows=3000)]
    assert len(held) >= 20
    assert max(held) < path.stat().st_size / 3  # pre-buffered: the whole file (2.6 MB here)


def test_output_trips_symbol_column_amount_note_and_large_json(tmp_path: Path) -> None:
    write_panel(tmp_path / "panel.parquet", SMALL_RUN_SERIES + 1, rows=12, amount=False)
    notes: list[str] = []
    result = run_predict(panel_config(tmp_path / "panel.parquet", tmp_path / "o.parquet", lookback=8, pred_len=1,
                                      chunk_series=64, sample_count=1),
                         on_note=lambda level, text: notes.append(text))
    written = pd.read_parquet(tmp_path / "o.parquet")
    assert list(written.columns[:2]) == ["Code", "timestamps"] and "amount" in written.columns
    assert any("no amount column" in n and "amount column is predicted" in n for n in notes)
    report = result.to_json_dict()
    assert report["series"] == SMALL_RUN_SERIES + 1 and report["predictions_embedded"] is False
    assert "predictions" not in report and "in --out only" in report["predictions_note"]
    assert report["job"]["chunks"] == 2 and report["job"]["rows"] == SMALL_RUN_SERIES + 1
    assert sum(r["series"] for r in report["job"]["ranks"].values()) == SMALL_RUN_SERIES + 1


def test_with_stream_keys_a_series_forecast_does_not_depend_on_the_chunking(tmp_path: Path) -> None:
    write_panel(tmp_path / "panel.parquet", 7)
    run_predict(panel_config(tmp_path / "panel.parquet", tmp_path / "threes.parquet"))
    run_predict(panel_config(tmp_path / "panel.parquet", tmp_path / "one.parquet", chunk_series=7))
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "threes.parquet"),
                                  pd.read_parquet(tmp_path / "one.parquet"))


def test_the_chunk_size_is_chosen_from_the_job_and_a_resume_counts_what_it_predicts(tmp_path: Path) -> None:
    write_panel(tmp_path / "panel.parquet", 40)
    notes: list[str] = []
    config = panel_config(tmp_path / "panel.parquet", tmp_path / "full.parquet", chunk_series=None)
    full = run_predict(config, on_note=lambda level, text: notes.append(text))
    # 40 series, one process: at least 8 chunks, none below 16 series -> 16, 16, 8
    assert full.job["chunk_series"] == 16 and full.job["chunks"] == 3
    assert any(n.startswith("chunks of 16 series: 3 chunks (chosen from the job") for n in notes)

    cut = panel_config(tmp_path / "panel.parquet", tmp_path / "cut.parquet", chunk_series=None)
    with pytest.raises(KronosTuneError):
        run_predict(cut, on_job_progress=StopAfter(2))
    notes.clear()
    resumed = run_predict(panel_config(tmp_path / "panel.parquet", tmp_path / "cut.parquet", chunk_series=None,
                                       resume=True), on_note=lambda level, text: notes.append(text))
    assert resumed.job["chunk_series"] == 16 and resumed.resumed_series == 32 and resumed.series_predicted == 8
    assert resumed.series_per_s == pytest.approx(8 / resumed.predict_seconds)
    assert any("resumed: kept 2 of 3 chunks (32 of 40 series) finished before; predicted the other 1 (8 series) now"
               in n for n in notes)
    assert (tmp_path / "cut.parquet").read_bytes() == (tmp_path / "full.parquet").read_bytes()


def test_a_run_without_out_is_the_same_job_in_memory(tmp_path: Path) -> None:
    write_panel(tmp_path / "panel.parquet", 20)
    written = run_predict(panel_config(tmp_path / "panel.parquet", tmp_path / "o.parquet", chunk_series=None))
    kept = run_predict(panel_config(tmp_path / "panel.parquet", None, chunk_series=None))
    assert kept.out is None and kept.job["chunks"] == written.job["chunks"] == 2  # 16 + 4 series
    assert not list(tmp_path.glob("*.work")) and sorted(p.name for p in tmp_path.iterdir()) == ["o.parquet",
                                                                                                 "panel.parquet"]
    table = pd.read_parquet(tmp_path / "o.parquet")
    assert kept.series_names == sorted(kept.series_names) == list(dict.fromkeys(table["Code"]))
    memory = kept.long_frame()
    np.testing.assert_array_equal(memory["close"].to_numpy(), table["close"].to_numpy())


def test_a_resume_with_another_date_format_is_refused(tmp_path: Path) -> None:
    write_panel(tmp_path / "panel.parquet", 8)
    with pytest.raises(KronosTuneError):
        run_predict(panel_config(tmp_path / "panel.parquet", tmp_path / "o.parquet"), on_job_progress=StopAfter(1))
    with pytest.raises(KronosTuneError) as caught:
        run_predict(panel_config(tmp_path / "panel.parquet", tmp_path / "o.parquet", resume=True,
                                 date_format="%Y-%m-%d %H:%M:%S"))
    assert "date_format" in str(caught.value) and "\n" not in str(caught.value)
