"""Tokenizer training: reconstruction improves, best/ is a loadable tokenizer, a predictor trains on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kronos_core.tokenizer import KronosTokenizer
from kronos_core.train import TrainConfig, Trainer


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(tmp_path: Path, **fields) -> TrainConfig:
    values = dict(model_size="tiny", lookback_window=16, predict_window=4, batch_size=8, samples_per_epoch=8 * 40,
                  epochs=1, eval_samples=32, synthetic_series=3, synthetic_rows=300, output_dir=str(tmp_path / "run"))
    values.update(fields)
    return TrainConfig(**values)


def test_tokenizer_training_improves_reconstruction(tmp_path: Path) -> None:
    trainer = Trainer(tiny(tmp_path, what="tokenizer", lr=2e-3))
    assert trainer.tokenizer is None and isinstance(trainer.model, KronosTokenizer)
    before = trainer.evaluate()
    assert set(before) == {"val_loss", "recon_mse", "recon_s1_mse", "val_elements"}
    assert before["val_loss"] == before["recon_mse"] and before["val_elements"] > 0
    records = []
    trainer.callback = records.append
    summary = trainer.fit()
    assert summary.steps == 40 and records[0].tokens == 8 * 21  # the tokenizer sees every row of the window
    assert summary.last_eval["recon_mse"] < 0.7 * before["recon_mse"]
    loaded = KronosTokenizer.from_pretrained(Path(summary.best_dir))
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


def test_predictor_trains_on_a_tokenizer_folder_which_stays_frozen(tmp_path: Path) -> None:
    tokenizer_run = Trainer(tiny(tmp_path / "tok", what="tokenizer", lr=2e-3)).fit(max_steps=5)
    frozen = KronosTokenizer.from_pretrained(tokenizer_run.best_dir)
    trainer = Trainer(tiny(tmp_path / "pred", tokenizer_dir=tokenizer_run.best_dir))
    assert not any(p.requires_grad for p in trainer.tokenizer.parameters()) and not trainer.tokenizer.training
    trainer.run_steps(2)
    for name, value in frozen.state_dict().items():
        assert torch.equal(trainer.tokenizer.state_dict()[name], value), name
    # A tokenizer given by folder is not copied into the run.
    assert not (tmp_path / "pred" / "run" / "tokenizer").exists()
