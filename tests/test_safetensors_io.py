"""Checkpoint files through the safetensors package: round trips, broken files, failed writes, lazy loading."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from kronos_core.errors import KronosError
from kronos_core.model import Kronos
from kronos_core.pretrained import WEIGHTS_NAME
from kronos_core.safetensors_io import load_safetensors, save_safetensors
from kronos_core.sizes import SIZES, build_model, build_tokenizer
from kronos_core.tokenizer import KronosTokenizer

REPO = Path(__file__).resolve().parents[1]


def _every_dtype() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    floats = torch.randn(4, 5, generator=g)
    floats[0, :3] = torch.tensor([float("nan"), -0.0, float("inf")])  # bit patterns a cast would lose
    return {
        "f32": floats, "f64": floats.double(), "f16": floats.half(), "bf16": floats.to(torch.bfloat16),
        "i64": torch.randint(-2**40, 2**40, (3, 2), generator=g), "i32": torch.randint(-9, 9, (7,), dtype=torch.int32),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8), "u8": torch.arange(256, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]), "empty": torch.zeros(0, 3), "scalar": torch.tensor(2.5),
    }


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).contiguous().view(torch.uint8) if tensor.numel() else tensor


def _craft(path: Path, header: dict, body: bytes) -> None:
    """A safetensors file written by hand: 8-byte little-endian header length, JSON header, data."""
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + body)


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_round_trip_is_bit_identical_for_every_dtype(tmp_path):
    tensors = _every_dtype()
    tensors["view"] = torch.arange(12.0).reshape(3, 4).t()  # not contiguous: saved as its values
    save_safetensors(tensors, tmp_path / "x.safetensors", metadata={"format": "pt"})
    loaded = load_safetensors(tmp_path / "x.safetensors")
    assert sorted(loaded) == sorted(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and loaded[name].shape == tensor.shape, name
        assert torch.equal(_bits(loaded[name]), _bits(tensor)), name
    with safe_open(str(tmp_path / "x.safetensors"), framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}


def test_load_to_a_chosen_dtype_converts_floats_only(tmp_path):
    tensors = _every_dtype()
    save_safetensors(tensors, tmp_path / "x.safetensors")
    loaded = load_safetensors(tmp_path / "x.safetensors", dtype=torch.bfloat16)
    for name, tensor in tensors.items():
        expected = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        assert loaded[name].dtype == expected.dtype, name
        assert torch.equal(_bits(loaded[name]), _bits(expected)), name
    per_name = load_safetensors(tmp_path / "x.safetensors", dtype={"f32": torch.float64, "i32": torch.int64})
    assert per_name["f32"].dtype == torch.float64 and per_name["i32"].dtype == torch.int64
    assert per_name["f16"].dtype == torch.float16


def test_a_truncated_file_names_the_tensor_it_cuts(tmp_path):
    path = tmp_path / "x.safetensors"
    save_safetensors({"first": torch.ones(100), "second": torch.ones(100)}, path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(KronosError) as error:
        load_safetensors(path)
    message = _one_line(error)
    assert f"{path} is truncated: tensor 'second' needs bytes 400..800" in message and "save it again" in message


def test_a_byte_span_that_does_not_match_the_shape_names_the_tensor(tmp_path):
    path = tmp_path / "x.safetensors"
    header = {"good": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "bad": {"dtype": "F32", "shape": [2, 3], "data_offsets": [8, 28]}}
    _craft(path, header, bytes(28))
    with pytest.raises(KronosError) as error:
        load_safetensors(path)
    message = _one_line(error)
    assert "tensor 'bad' is F32 of shape (2, 3) (24 bytes) but its data span is 20 bytes" in message
    assert str(path) in message


@pytest.mark.parametrize(("content", "expected"), [
    (b"", "truncated or not a safetensors file (0 bytes)"),
    (struct.pack("<Q", 1 << 40) + b"{}", "truncated or not a safetensors file"),
    (struct.pack("<Q", 8) + b"not json", "not a valid safetensors file"),
])
def test_a_file_that_is_not_safetensors_is_one_line(tmp_path, content, expected):
    path = tmp_path / "x.safetensors"
    path.write_bytes(content)
    with pytest.raises(KronosError) as error:
        load_safetensors(path)
    assert expected in _one_line(error)


def test_a_missing_file_and_a_bad_device_are_one_line(tmp_path):
    with pytest.raises(KronosError, match="does not exist"):
        load_safetensors(tmp_path / "absent.safetensors")
    save_safetensors({"a": torch.ones(2)}, tmp_path / "x.safetensors")
    with pytest.raises(KronosError, match="onto device 'meta'"):
        load_safetensors(tmp_path / "x.safetensors", device="meta")


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temp_file(tmp_path):
    """The file-size limit makes the library's write fail after its first ~100 kB, in a process of its own."""
    path = tmp_path / "w.safetensors"
    save_safetensors({"old": torch.arange(10.0)}, path)
    before = path.read_bytes()
    script = textwrap.dedent(f"""
        import resource, signal, torch
        from kronos_core.errors import KronosError
        from kronos_core.safetensors_io import save_safetensors
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
        try:
            save_safetensors({{"new": torch.ones(1_000_000)}}, {str(path)!r})
        except KronosError as error:
            print(error)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(f"cannot write {path}") and "free space" in done.stdout
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == [path.name]


def test_saving_into_a_missing_folder_is_one_line(tmp_path):
    with pytest.raises(KronosError, match="cannot write .*absent"):
        save_safetensors({"a": torch.ones(2)}, tmp_path / "absent" / "x.safetensors")


def _stamps(batch: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.stack([torch.randint(0, high, (batch, length), generator=g)
                        for high in (60, 24, 7, 32, 13)], dim=-1).float()


@pytest.mark.parametrize("learn_te", [True, False])
def test_from_pretrained_gives_the_saved_models_outputs_bit_for_bit(tmp_path, learn_te):
    torch.manual_seed(5)
    model = Kronos(**{**SIZES["tiny"].model, "learn_te": learn_te}).eval()
    model.save_pretrained(tmp_path)
    loaded = Kronos.from_pretrained(tmp_path).eval()
    saved_tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    loaded_tensors = dict(loaded.named_parameters()) | dict(loaded.named_buffers())
    assert sorted(loaded_tensors) == sorted(saved_tensors)
    for name, tensor in loaded_tensors.items():  # every parameter and buffer, persistent or not
        assert tensor.device == torch.device("cpu") and not tensor.is_meta, name
        assert tensor.dtype == saved_tensors[name].dtype and torch.equal(tensor, saved_tensors[name]), name
        assert tensor.requires_grad == saved_tensors[name].requires_grad, name
    s1, s2 = torch.randint(0, 1024, (2, 2, 9))
    stamp = _stamps(2, 9)
    with torch.no_grad():
        expected = model.decode_s1(s1, s2, stamp)
        got = loaded.decode_s1(s1, s2, stamp)
        assert all(torch.equal(a, b) for a, b in zip(expected, got))
        assert torch.equal(model.decode_s2(expected[1], s1), loaded.decode_s2(got[1], s1))


def test_tokenizer_from_pretrained_encodes_and_decodes_bit_for_bit(tmp_path):
    tokenizer = build_tokenizer("tiny", seed=2).eval()
    tokenizer.save_pretrained(tmp_path)
    loaded = KronosTokenizer.from_pretrained(tmp_path).eval()
    assert {name: buffer.dtype for name, buffer in loaded.named_buffers()} == \
        {name: buffer.dtype for name, buffer in tokenizer.named_buffers()}
    x = torch.randn(2, 16, 6, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ids, again = tokenizer.encode(x, half=True), loaded.encode(x, half=True)
        assert all(torch.equal(a, b) for a, b in zip(ids, again))
        assert torch.equal(tokenizer.decode(ids, half=True), loaded.decode(again, half=True))


def test_from_pretrained_draws_no_random_numbers_and_maps_the_file(tmp_path):
    """No random init runs (the global generator is untouched) and, on Linux, every weight lies in a
    mapping of model.safetensors: the file's pages, not a copy."""
    build_model("tiny", seed=1).save_pretrained(tmp_path)
    state = torch.random.get_rng_state()
    loaded = Kronos.from_pretrained(tmp_path)
    assert torch.equal(torch.random.get_rng_state(), state)
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return
    weights = str((tmp_path / WEIGHTS_NAME).resolve())
    spans = [tuple(int(part, 16) for part in line.split()[0].split("-"))
             for line in maps.read_text().splitlines() if line.endswith(weights)]
    assert spans
    for name, tensor in loaded.state_dict().items():
        assert any(start <= tensor.data_ptr() < end for start, end in spans), name


def test_from_pretrained_to_a_chosen_dtype(tmp_path):
    tokenizer = build_tokenizer("tiny", seed=4)
    tokenizer.save_pretrained(tmp_path)
    loaded = KronosTokenizer.from_pretrained(tmp_path, dtype=torch.bfloat16)
    for name, tensor in tokenizer.state_dict().items():
        got = loaded.state_dict()[name]
        if tensor.is_floating_point():
            assert got.dtype == torch.bfloat16 and torch.equal(got, tensor.to(torch.bfloat16)), name
        else:
            assert got.dtype == tensor.dtype and torch.equal(got, tensor), name


def test_an_unexpected_weight_is_named(tmp_path):
    model = build_model("tiny")
    model.save_pretrained(tmp_path)
    save_safetensors({**model.state_dict(), "extra.weight": torch.ones(1)}, tmp_path / WEIGHTS_NAME)
    with pytest.raises(KronosError, match="has unexpected weight 'extra.weight'"):
        Kronos.from_pretrained(tmp_path)


def test_a_fresh_process_loads_without_importing_torch_dynamo(tmp_path):
    """Building on the meta device must not route arithmetic through torch's Python decompositions,
    whose first use imports torch._dynamo (seconds and ~75 MiB in every process that loads a model)."""
    build_model("tiny").save_pretrained(tmp_path / "predictor")
    build_tokenizer("tiny").save_pretrained(tmp_path / "tokenizer")
    script = textwrap.dedent(f"""
        import sys
        from kronos_core.model import Kronos
        from kronos_core.tokenizer import KronosTokenizer
        Kronos.from_pretrained({str(tmp_path / "predictor")!r})
        KronosTokenizer.from_pretrained({str(tmp_path / "tokenizer")!r})
        print("torch._dynamo" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.slow
def test_the_load_benchmark_reports_both_figures():
    done = subprocess.run([sys.executable, "-m", "benchmarks.load", "--size", "tiny", "--repeats", "1"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith("1 loads, each in a fresh process") and "model.safetensors" in lines[0]
    assert any(line.startswith("load: peak RSS added by from_pretrained") for line in lines)
    assert any(line.startswith("touched: RSS added once every weight was read") for line in lines)
