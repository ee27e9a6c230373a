"""Published models by hub id: a Hugging Face cache laid out as the library documents it, in a temporary folder.

The cache (`$HF_HUB_CACHE`, or `$HF_HOME/hub`) holds `models--OWNER--NAME/refs/<ref>` (the commit hash, no
newline) and `models--OWNER--NAME/snapshots/<commit>/<file>`, each file a relative symlink into
`blobs/<sha256>`; the tests write it from tiny models saved with save_pretrained, offline (no network here).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from kronos_core.errors import KronosError
from kronos_core.hub import parse_hub_id, resolve_pretrained
from kronos_core.model import Kronos
from kronos_core.pretrained import CONFIG_NAME, WEIGHTS_NAME
from kronos_core.sizes import build_model, build_tokenizer
from kronos_core.tokenizer import KronosTokenizer
from kronos_tune.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

COMMIT_A = "a1" * 20
COMMIT_B = "b2" * 20
REPO = "Owner/Kronos-tiny"
ROOT = Path(__file__).resolve().parents[1]


def add_snapshot(cache: Path, repo_id: str, folder: Path, commit: str, refs: tuple[str, ...] = ("main",),
                 files: tuple[str, ...] = (CONFIG_NAME, WEIGHTS_NAME), blobs: bool = True) -> Path:
    """Put `folder`'s files into `cache` as the snapshot `commit` of `repo_id`, pointed to by `refs`."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in files:
        data = (folder / name).read_bytes()
        if blobs:
            blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(exist_ok=True)
            blob.write_bytes(data)
            (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
        else:
            (snapshot / name).write_bytes(data)
    for ref in refs:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # the library writes the hash without a newline
    return snapshot


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """An offline cache with REPO at COMMIT_B (main) and COMMIT_A (tag v1), and a tokenizer repo."""
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folders = {}
    for name, seed in (("a", 1), ("b", 2)):
        folders[name] = tmp_path / f"model-{name}"
        build_model("tiny", seed=seed).save_pretrained(folders[name])
    folders["tokenizer"] = tmp_path / "tokenizer"
    build_tokenizer("tiny", seed=3).save_pretrained(folders["tokenizer"])
    add_snapshot(cache, REPO, folders["a"], COMMIT_A, refs=("v1",))
    add_snapshot(cache, REPO, folders["b"], COMMIT_B, refs=("main",))
    add_snapshot(cache, "Owner/Tokenizer-tiny", folders["tokenizer"], COMMIT_A, blobs=False)
    return {"cache": cache, **folders}


def assert_same_weights(left: torch.nn.Module, right: torch.nn.Module) -> None:
    a, b = left.state_dict(), right.state_dict()
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def test_hub_id_loads_bit_identical_weights_from_the_cache(hub: dict) -> None:
    assert_same_weights(Kronos.from_pretrained(REPO), Kronos.from_pretrained(hub["b"]))
    assert_same_weights(KronosTokenizer.from_pretrained("Owner/Tokenizer-tiny"),
                        KronosTokenizer.from_pretrained(hub["tokenizer"]))
    found = resolve_pretrained(REPO)
    assert found.path == hub["cache"] / "models--Owner--Kronos-tiny" / "snapshots" / COMMIT_B
    assert (found.repo_id, found.revision, found.commit, found.downloaded) == (REPO, "main", COMMIT_B, False)
    assert found.describe() == (f"checkpoint {REPO}@main: commit {COMMIT_B}, from the Hugging Face cache "
                                f"({found.path})")


def test_hf_home_locates_the_cache_too(hub: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    home = hub["cache"].parent / "hf-home"
    home.mkdir()
    hub["cache"].rename(home / "hub")
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    assert resolve_pretrained(REPO).path == home / "hub" / "models--Owner--Kronos-tiny" / "snapshots" / COMMIT_B


def test_a_revision_pins_the_snapshot(hub: dict) -> None:
    for pinned in (f"{REPO}@{COMMIT_A}", f"{REPO}@v1"):
        assert resolve_pretrained(pinned).commit == COMMIT_A
        assert_same_weights(Kronos.from_pretrained(pinned), Kronos.from_pretrained(hub["a"]))
    assert_same_weights(Kronos.from_pretrained(REPO, revision="v1"), Kronos.from_pretrained(hub["a"]))
    assert resolve_pretrained(f"{REPO}@v1").revision == "v1"
    with pytest.raises(KronosError, match="revision v2 while offline"):
        resolve_pretrained(f"{REPO}@v2")


def test_an_existing_folder_wins_over_a_hub_id(hub: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    local = Path(REPO)  # ./Owner/Kronos-tiny holds model a; the cache's main is model b
    build_model("tiny", seed=1).save_pretrained(local)
    found = resolve_pretrained(REPO)
    assert found.path == local and not found.from_hub
    assert_same_weights(Kronos.from_pretrained(REPO), Kronos.from_pretrained(hub["a"]))


def test_not_cached_offline_names_the_command_that_fetches_it(hub: dict) -> None:
    with pytest.raises(KronosError) as caught:
        Kronos.from_pretrained("NeoQuasar/Kronos-small")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("checkpoint NeoQuasar/Kronos-small: no such folder, and the Hugging Face cache")
    assert "while offline (HF_HUB_OFFLINE=1 / --offline)" in message
    assert "snapshot_download('NeoQuasar/Kronos-small')" in message


def test_a_snapshot_without_the_weights_is_refused(hub: dict, tmp_path: Path) -> None:
    add_snapshot(hub["cache"], "Owner/no-weights", hub["a"], COMMIT_A, files=(CONFIG_NAME,))
    with pytest.raises(KronosError) as caught:
        Kronos.from_pretrained("Owner/no-weights")
    message = str(caught.value)
    assert "lacks model.safetensors" in message and "\n" not in message
    assert "snapshot_download('Owner/no-weights')" in message


def test_paths_that_are_not_hub_ids_keep_the_folder_errors(hub: dict, tmp_path: Path) -> None:
    for text in ("./Kronos-small", "../x/y", "a/b/c", str(tmp_path / "missing")):
        assert parse_hub_id(text) is None, text
    with pytest.raises(KronosError) as caught:
        Kronos.from_pretrained("./Kronos-small")
    assert str(caught.value) == ("checkpoint folder Kronos-small does not exist; pass a folder holding config.json "
                                 "and model.safetensors")
    assert str(parse_hub_id("NeoQuasar/Kronos-small@v1.0")) == "NeoQuasar/Kronos-small@v1.0"


def test_without_the_package_a_hub_id_says_how_to_install_it(hub: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # what `import` does for a package not installed
    with pytest.raises(KronosError, match=r'needs huggingface_hub, which is not installed: pip install "kronos-tune\[hub\]"'):
        Kronos.from_pretrained(REPO)
    assert not resolve_pretrained(hub["a"]).from_hub  # folders never need it


class _FakeHubMiss(http.server.BaseHTTPRequestHandler):
    """A hub endpoint that knows no repo (401 + X-Error-Code: RepoNotFound, as the hub answers an anonymous
    request for a missing or private repo), counting its requests."""

    requests: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).requests.append(self.path)
        self.send_response(401)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"error": "Repository Not Found"}).encode())

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


def _resolve_in_child(env: dict[str, str], *sources: str) -> list[str]:
    """resolve_pretrained of each source in one fresh process (huggingface_hub reads HF_ENDPOINT at import)."""
    code = ("import sys\nfrom kronos_core.hub import resolve_pretrained\nfrom kronos_core.errors import KronosError\n"
            "for source in sys.argv[1:]:\n    try:\n        print('ok', resolve_pretrained(source).describe())\n"
            "    except KronosError as error:\n        print('error', error)\n")
    done = subprocess.run([sys.executable, "-c", code, *sources], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()


def test_online_the_cache_comes_first_and_an_unknown_repo_is_one_line(hub: dict) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeHubMiss)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    try:
        _FakeHubMiss.requests.clear()
        cached, unknown = _resolve_in_child(env, REPO, "Owner/unknown")
    finally:
        server.shutdown()
        server.server_close()
    assert cached.startswith(f"ok checkpoint {REPO}@main: commit {COMMIT_B}")
    assert all("Kronos-tiny" not in path for path in _FakeHubMiss.requests)  # cached: no network call for it
    assert _FakeHubMiss.requests  # the unknown one was asked for
    assert unknown.startswith("error checkpoint Owner/unknown is neither a folder nor a model repo on the "
                              "Hugging Face hub"), unknown


def test_online_without_a_reachable_hub_says_how_to_fetch_it(hub: dict) -> None:
    closed = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens on the discard port
    (answer,) = _resolve_in_child(closed, "Owner/unknown")
    assert answer.startswith("error checkpoint Owner/unknown: no such folder, not in the Hugging Face cache")
    assert "the hub could not be reached" in answer and "snapshot_download('Owner/unknown')" in answer


# The commands -------------------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as caught:
        main([*map(str, args)])
    captured = capsys.readouterr()
    return caught.value.code, captured.out, captured.err


def test_predict_by_hub_id_equals_the_folder_load(hub: dict, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")  # --offline alone keeps it from the network
    common = ("predict", "--device", "cpu", "--synthetic", 2, "--lookback", 24, "--pred-len", 3, "--sample-count",
              2, "--json")
    code, out, err = _cli(capsys, *common, "--checkpoint", f"{REPO}@v1", "--tokenizer", "Owner/Tokenizer-tiny",
                          "--offline")
    assert code == 0, err
    by_id = json.loads(out)
    assert f"note: checkpoint {REPO}@v1: commit {COMMIT_A}, from the Hugging Face cache" in err
    assert "note: tokenizer Owner/Tokenizer-tiny@main: commit" in err
    assert by_id["weights"]["checkpoint"]["commit"] == COMMIT_A
    assert by_id["weights"]["checkpoint"]["source"] == f"{REPO}@v1"
    assert by_id["weights"]["tokenizer"]["repo_id"] == "Owner/Tokenizer-tiny"
    code, out, err = _cli(capsys, *common, "--checkpoint", hub["a"], "--tokenizer", hub["tokenizer"])
    assert code == 0, err
    by_folder = json.loads(out)
    assert by_id["predictions"] == by_folder["predictions"]
    assert by_folder["weights"]["checkpoint"] == {"source": str(hub["a"]), "path": str(hub["a"])}


def test_predict_offline_and_not_cached_is_one_line_exit_2(hub: dict, capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    out = tmp_path / "pred.csv"
    out.write_text("kept\n")
    code, _, err = _cli(capsys, "predict", "--device", "cpu", "--synthetic", 2, "--lookback", 24, "--pred-len", 3,
                        "--checkpoint", "NeoQuasar/Kronos-small", "--tokenizer", "NeoQuasar/Kronos-Tokenizer-base",
                        "--offline", "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "snapshot_download('NeoQuasar/Kronos-small')" in err
    assert out.read_text() == "kept\n"


def test_backtest_records_the_resolved_snapshots_in_run_json(hub: dict, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "backtest"
    code, _, err = _cli(capsys, "backtest", "--device", "cpu", "--checkpoint", REPO, "--tokenizer",
                        "Owner/Tokenizer-tiny", "--synthetic", 4, "--origins", 1, "--lookback", 24, "--pred-len", 2,
                        "--top-k", 1, "--out", run, "--json")
    assert code == 0, err
    assert f"note: checkpoint {REPO}@main: commit {COMMIT_B}" in err
    recorded = json.loads((run / "run.json").read_text())["weights"]
    assert recorded["checkpoint"]["commit"] == COMMIT_B and recorded["tokenizer"]["commit"] == COMMIT_A
    assert recorded["checkpoint"]["path"] == str(hub["cache"] / "models--Owner--Kronos-tiny" / "snapshots" / COMMIT_B)


def test_backtest_offline_and_not_cached_leaves_no_run_folder(hub: dict, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "backtest", "--device", "cpu", "--checkpoint", "Owner/missing", "--tokenizer",
                        "Owner/Tokenizer-tiny", "--synthetic", 4, "--lookback", 24, "--pred-len", 2, "--top-k", 1,
                        "--out", tmp_path / "run")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "snapshot_download('Owner/missing')" in err
    assert not (tmp_path / "run").exists()


def test_train_from_hub_ids_records_them_in_run_json(hub: dict, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from tiny_preset import tiny_train_toml

    config = tmp_path / "finetune.toml"
    config.write_text(tiny_train_toml(predictor_dir=f"{REPO}@v1", tokenizer_dir="Owner/Tokenizer-tiny"))
    out = tmp_path / "train"
    code, printed, err = _cli(capsys, "train", "--config", config, "--steps", 1, "--out", out, "--offline",
                              "--no-tensorboard")
    assert code == 0, err
    assert f"note: predictor_dir {REPO}@v1: commit {COMMIT_A}, from the Hugging Face cache" in printed
    recorded = json.loads((out / "run.json").read_text())["weights"]
    assert recorded["predictor_dir"]["commit"] == COMMIT_A and recorded["tokenizer_dir"]["revision"] == "main"
    # the run started from model a's weights: its config keeps the hub id, so the same config continues it
    assert json.loads((out / "run.json").read_text())["status"] in ("partial", "complete")
    assert 'predictor_dir = "Owner/Kronos-tiny@v1"' in (out / "config.toml").read_text()

    missing = tmp_path / "missing.toml"
    missing.write_text(tiny_train_toml(predictor_dir="Owner/missing", tokenizer_dir="Owner/Tokenizer-tiny"))
    code, _, err = _cli(capsys, "train", "--config", missing, "--steps", 1, "--out", tmp_path / "never",
                        "--no-tensorboard")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "snapshot_download('Owner/missing')" in err
    assert not (tmp_path / "never").exists()


def test_the_load_benchmarks_cache_is_one_the_library_reads(hub: dict, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.load import write_hub_cache

    cache = tmp_path / "bench-cache"
    commit = write_hub_cache(hub["a"], cache, "kronos-bench/tiny")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    found = resolve_pretrained("kronos-bench/tiny")
    assert found.commit == commit and found.path == cache / "models--kronos-bench--tiny" / "snapshots" / commit
    assert (found.path / WEIGHTS_NAME).is_symlink()
    assert_same_weights(Kronos.from_pretrained("kronos-bench/tiny"), Kronos.from_pretrained(hub["a"]))
