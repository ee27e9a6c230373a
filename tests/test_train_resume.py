"""Checkpoints: exact resume, weights_only loading, atomic files, stop requests, mismatches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kronos_core.errors import KronosError
from kronos_core.train import StepRecord, TrainConfig, Trainer, checkpoint_path, load_checkpoint


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(out: Path, **fields) -> TrainConfig:
    # Sampled s1 (teacher_forcing=False) draws from the torch RNG every step, so
    # an exact resume needs the RNG state back, not only weights and data position.
    values = dict(model_size="tiny", lookback_window=16, predict_window=4, batch_size=8, samples_per_epoch=32,
                  epochs=3, eval_samples=16, synthetic_series=2, synthetic_rows=200, teacher_forcing=False,
                  output_dir=str(out))
    values.update(fields)
    return TrainConfig(**values)


def test_resume_is_exact(tmp_path: Path) -> None:
    straight: list[StepRecord] = []
    reference = Trainer(tiny(tmp_path / "straight"), callback=straight.append)
    reference.fit(max_steps=6)  # 4 steps per epoch: crosses an epoch boundary

    first: list[StepRecord] = []
    config = tiny(tmp_path / "split")
    summary = Trainer(config, callback=first.append).fit(max_steps=3)
    assert summary.steps == 3 and not summary.interrupted
    state = load_checkpoint(tmp_path / "split")  # torch.load(weights_only=True) inside
    assert state["step"] == 3 and state["epoch"] == 0 and state["step_in_epoch"] == 3
    resumed_records: list[StepRecord] = []
    resumed = Trainer(config, callback=resumed_records.append, resume=tmp_path / "split")
    assert resumed.step == 3
    resumed.fit(max_steps=6)

    losses = [r.loss for r in first + resumed_records]
    assert [r.step for r in first + resumed_records] == list(range(1, 7))
    assert losses == pytest.approx([r.loss for r in straight], abs=1e-6, rel=0)
    for name, value in reference.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], value, atol=1e-6, rtol=0, msg=name)
    for a, b in zip(reference.optimizer.state_dict()["state"].values(),
                    resumed.optimizer.state_dict()["state"].values()):
        torch.testing.assert_close(a["exp_avg_sq"], b["exp_avg_sq"], atol=1e-9, rtol=1e-6)
    assert resumed.scheduler.state_dict()["last_epoch"] == reference.scheduler.state_dict()["last_epoch"]


def test_checkpoint_file_is_plain_and_atomic(tmp_path: Path) -> None:
    trainer = Trainer(tiny(tmp_path, save_every=2))
    trainer.fit(max_steps=4)
    folder = checkpoint_path(tmp_path).parent
    assert [p.name for p in folder.iterdir()] == ["last.pt"]  # no temp files left behind
    payload = torch.load(folder / "last.pt", weights_only=True)
    assert set(payload) >= {"model", "optimizer", "scheduler", "scaler", "rng", "step", "epoch", "config"}
    rng = payload["rng"][0]
    assert isinstance(rng["torch"], torch.Tensor) and isinstance(rng["numpy_key"], torch.Tensor)
    assert payload["config"]["model_size"] == "tiny"
    (folder / "last.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(KronosError, match="not a loadable training checkpoint"):
        load_checkpoint(tmp_path)


def test_stop_request_saves_a_resumable_checkpoint(tmp_path: Path) -> None:
    records: list[StepRecord] = []
    trainer = Trainer(tiny(tmp_path), callback=records.append)

    def stop_at_two(record: StepRecord) -> None:
        records.append(record)
        if record.step == 2:
            trainer.request_stop()

    trainer.callback = stop_at_two
    summary = trainer.fit()
    assert summary.interrupted and summary.steps == 2 and len(records) == 2
    assert load_checkpoint(tmp_path)["step"] == 2
    assert Trainer(tiny(tmp_path), resume=tmp_path).fit(max_steps=3).steps == 3


def test_resume_refuses_a_different_run(tmp_path: Path) -> None:
    Trainer(tiny(tmp_path)).fit(max_steps=1)
    with pytest.raises(KronosError, match="global batch of 8 windows"):
        Trainer(tiny(tmp_path, batch_size=4), resume=tmp_path)
    with pytest.raises(KronosError, match="trains the predictor"):
        Trainer(tiny(tmp_path, what="tokenizer"), resume=tmp_path)
    (tmp_path / "other").mkdir()
    with pytest.raises(KronosError, match="holds no checkpoints/last.pt"):
        Trainer(tiny(tmp_path / "other"), resume=tmp_path / "other")
