"""The work folder of a large `predict --out` job: beside --out, holding every finished chunk until the end.

    preds.parquet.work/
      manifest.json          what the job is (data, model, settings): a resume must match it
      parts/chunk-000012.parquet   one chunk's output rows, written atomically
      done/chunk-000012.json       that chunk is finished: by which rank, its rows, its decimals (atomic, fsynced)
      inputs/chunk-000012.npz      a sharded run's chunk inputs, for the ranks
      markers/                     each rank's proof that it sees the same folder (several nodes)

A chunk counts as finished only once its `done/` record exists, and that record is written after its part
(both through `kronos_core.files`: temp file, fsync, rename, fsync of the folder). So SIGINT, SIGTERM, an
out-of-memory kill or `kill -9` keep every finished chunk, and the records are the truth after any
restart. `--out` itself is written from the parts at the end, atomically; the folder is then removed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kronos_core.files import atomic_path, write_text_atomic
from kronos_tune.errors import KronosTuneError

MANIFEST = "manifest.json"
TOOL = "kronos-tune predict"


def work_folder_for(out: Path) -> Path:
    return out.with_name(out.name + ".work")


@dataclass(frozen=True)
class DoneChunk:
    chunk: int
    rank: int
    series: int
    rows: int
    precision: tuple[int, int, int]  # decimals of the chunk's inputs: prices, volume, amount
    seconds: float


class WorkFolder:
    def __init__(self, path: Path, identity: dict[str, Any], created: bool = False) -> None:
        self.path = path
        self.identity = identity
        self.created = created  # by this run (removed again if it fails before any chunk is finished)

    @classmethod
    def existing(cls, out: Path) -> WorkFolder | None:
        """The work folder of `out` as its manifest describes it, or None when there is none."""
        folder = work_folder_for(out)
        manifest = folder / MANIFEST
        if not manifest.is_file():
            return None
        return cls(folder, json.loads(manifest.read_text()).get("identity", {}))

    @property
    def left_empty(self) -> bool:
        """Created by this run and no chunk finished: a failed run removes it (run_job), leaving no trace."""
        return self.created and not self.finished()

    @property
    def chunk_series(self) -> int:
        return int(self.identity["chunk_series"])

    def part(self, chunk: int) -> Path:
        return self.path / "parts" / f"chunk-{chunk:06d}.parquet"

    def inputs(self, chunk: int) -> Path:
        return self.path / "inputs" / f"chunk-{chunk:06d}.npz"

    def store(self, chunk: int, table: pd.DataFrame) -> None:
        """A chunk's part, written atomically (its record follows: `record`)."""
        with atomic_path(self.part(chunk)) as temp:
            table.to_parquet(temp, index=False)

    def read(self, chunk: int, columns: list[str] | None = None) -> pd.DataFrame:
        return pd.read_parquet(self.part(chunk), columns=columns)

    def record(self, done: DoneChunk) -> None:
        """Mark a chunk finished (after its part is written)."""
        write_text_atomic(self.path / "done" / f"chunk-{done.chunk:06d}.json",
                          json.dumps({**done.__dict__, "precision": list(done.precision)}))

    def finished(self) -> dict[int, DoneChunk]:
        """Every chunk whose record and part exist."""
        out = {}
        for file in sorted((self.path / "done").glob("chunk-*.json")):
            item = json.loads(file.read_text())
            done = DoneChunk(**{**item, "precision": tuple(item["precision"])})
            if self.part(done.chunk).is_file():
                out[done.chunk] = done
        return out

    def kept_note(self, resumable: bool) -> str:
        """What a stopped or failed job leaves behind, in words that stay true: a folder this run created is
        removed when it is `left_empty`, so then nothing is kept."""
        if self.left_empty:
            return "no chunk had finished, so nothing is kept; run the same command again"
        if self.finished():
            hint = "; run the same command with --resume to finish" if resumable else ""
            return f"the finished chunks are kept in {self.path}{hint}"
        return f"no chunk had finished; run the same command with --resume to start again from {self.path}"

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class MemoryWork:
    """The part sink of a job without --out in one process: the same chunks, kept in memory (nothing is
    written, so there is nothing to resume)."""

    path = None
    created = False
    left_empty = False

    def __init__(self, chunk_series: int) -> None:
        self.chunk_series = chunk_series
        self.tables: dict[int, pd.DataFrame] = {}
        self.records: dict[int, DoneChunk] = {}

    def store(self, chunk: int, table: pd.DataFrame) -> None:
        self.tables[chunk] = table

    def read(self, chunk: int, columns: list[str] | None = None) -> pd.DataFrame:
        table = self.tables[chunk]
        return table if columns is None else table[columns]

    def record(self, done: DoneChunk) -> None:
        self.records[done.chunk] = done

    def finished(self) -> dict[int, DoneChunk]:
        return dict(self.records)

    def kept_note(self, resumable: bool) -> str:
        return "nothing is kept without --out"

    def remove(self) -> None:
        self.tables.clear()


def _create(folder: Path, identity: dict[str, Any]) -> WorkFolder:
    for sub in ("parts", "done", "inputs", "markers"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / MANIFEST, json.dumps({"tool": TOOL, "identity": identity}, indent=1))
    return WorkFolder(folder, identity, created=True)


def temporary_work(identity: dict[str, Any]) -> WorkFolder:
    """A work folder of its own for a sharded run without --out (removed when it ends)."""
    return _create(Path(tempfile.mkdtemp(prefix="kronos-predict-job-")), identity)


def _describe(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def open_work(out: Path, identity: dict[str, Any], resume: bool, join: bool = False) -> WorkFolder:
    """The job's work folder: created (a fresh run), or checked against `identity` (--resume; `join`: another
    node of the same launch may have created it already). Refusals are one line naming what differs."""
    folder = work_folder_for(out)
    manifest = folder / MANIFEST
    existing = json.loads(manifest.read_text()) if manifest.is_file() else None
    if existing is None:
        if resume and not join:
            raise KronosTuneError(f"--resume: no work folder {folder} to continue (a job for --out {out} keeps its "
                                  f"finished chunks there); run without --resume to start the job")
        return _create(folder, identity)
    theirs = existing.get("identity", {})
    if not resume and not join:
        count = len(list((folder / "done").glob("chunk-*.json")))
        raise KronosTuneError(f"--out {out}: {folder} holds an unfinished job ({count} chunks finished); add "
                              f"--resume to continue it, or remove that folder to start over")
    keys = sorted(set(theirs) | set(identity))
    differ = [k for k in keys if theirs.get(k) != identity.get(k)]
    if differ:
        changes = "; ".join(f"{k}: {_describe(theirs.get(k))} there, {_describe(identity.get(k))} now"
                            for k in differ)
        raise KronosTuneError(f"--resume {folder}: that job was started with other data, model or settings "
                              f"({changes}); resume with its settings, or remove the folder to start over")
    return WorkFolder(folder, identity)
