"""DDP through real torchrun on CPU (gloo): same parameters as one process, a 2-node rendezvous, and
`kronos-tune train --nproc 2` through the shared launcher (progress events, metrics.jsonl)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kronos_core.launch import parse_event
from kronos_core.train import TrainConfig, Trainer, load_checkpoint

pytestmark = pytest.mark.slow


def tiny(out: Path, **fields) -> TrainConfig:
    values = dict(model_size="tiny", lookback_window=16, predict_window=4, batch_size=4, accumulation_steps=2,
                  samples_per_epoch=64, epochs=1, eval_samples=16, synthetic_series=2, synthetic_rows=200,
                  output_dir=str(out), device="cpu")
    values.update(fields)
    return TrainConfig(**values)


def child_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("WORLD_SIZE", None)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_gloo_processes_match_one_process(tmp_path: Path) -> None:
    steps = 4
    ddp_config = tiny(tmp_path / "ddp", batch_size=4)
    config_file = tmp_path / "ddp.toml"
    ddp_config.to_toml(config_file)
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "kronos_core.train", "--config", str(config_file), "--steps", str(steps), "--events"],
        env=child_env(), capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    events = [e for e in map(parse_event, run.stdout.splitlines()) if e is not None]
    ddp_losses = [e["loss"] for e in events if e["event"] == "step"]
    assert len(ddp_losses) == steps  # rank 0 alone reports
    assert [e["event"] for e in events if e["event"] != "step"] == ["start", "eval", "summary"]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = Trainer(tiny(tmp_path / "single", batch_size=8))  # the same global batch in one process
        single_losses = [r.loss for r in single.run_steps(steps)]
    finally:
        torch.set_num_threads(threads)
    assert ddp_losses == pytest.approx(single_losses, abs=1e-5)
    state = load_checkpoint(tmp_path / "ddp")  # written by rank 0 at the end of fit
    assert state["world_size"] == 2 and state["step"] == steps and len(state["rng"]) == 2
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(state["model"][name], value, atol=1e-5, rtol=0, msg=name)
    moved = max((state["model"][n] - v).abs().max().item() for n, v in Trainer(tiny(tmp_path / "init", batch_size=8))
                .model.state_dict().items())
    assert moved > 1e-5  # training really changed the parameters the comparison looks at


def test_two_node_rendezvous_on_localhost(tmp_path: Path) -> None:
    config_file = tmp_path / "two_nodes.toml"
    tiny(tmp_path / "out", batch_size=4, accumulation_steps=1).to_toml(config_file)
    port = free_port()
    agent = [sys.executable, "-m", "kronos_tune.cli", "train", "--config", str(config_file), "--steps", "2",
             "--nproc", "1", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
             "--rdzv-id", f"kronos-test-{port}"]
    nodes = [subprocess.Popen(agent, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [node.communicate(timeout=240) for node in nodes]
    for node, (out, err) in zip(nodes, outputs):
        assert node.returncode == 0, (out + err)[-3000:]
    state = load_checkpoint(tmp_path / "out")
    assert state["world_size"] == 2 and state["step"] == 2 and state["global_batch"] == 8
    assert any("2 / " in out for out, _ in outputs)  # the node hosting rank 0 drew the progress and summary


def test_train_nproc_2_goes_through_the_launcher_and_logs_rank_0s_events(tmp_path: Path, capsys,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from kronos_tune.cli import main
    from kronos_tune.run_logs import METRICS_FILE, TENSORBOARD_DIR

    config_file = tmp_path / "ddp.toml"
    tiny(tmp_path / "unused", batch_size=4, accumulation_steps=1, eval_every=2).to_toml(config_file)
    out = tmp_path / "run"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with pytest.raises(SystemExit) as info:
        main(["train", "--config", str(config_file), "--nproc", "2", "--steps", "3", "--out", str(out),
              "--tensorboard"])
    printed = capsys.readouterr().out
    assert (info.value.code or 0) == 0, printed[-3000:]
    assert "3 / 8" in printed and "@kronos-event" not in printed  # events drawn, not printed
    lines = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    assert [(line["kind"], line["step"]) for line in lines] == [("train", 1), ("train", 2), ("eval", 2),
                                                                 ("train", 3), ("eval", 3)]
    assert all(line["samples"] == 8 for line in lines if line["kind"] == "train")  # global: 4 x 2 processes
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(out / TENSORBOARD_DIR))
    board.Reload()
    assert [e.step for e in board.Scalars("train/loss")] == [1, 2, 3]
    assert load_checkpoint(out)["world_size"] == 2
    assert json.loads((out / "run.json").read_text())["status"] == "partial"
