"""Model family: sizes, state-dict layout, reference semantics, checkpoints."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kronos_core.pretrained import CONFIG_NAME, WEIGHTS_NAME
from kronos_core.errors import KronosError
from kronos_core.model import Kronos
from kronos_core.safetensors_io import load_safetensors, save_safetensors
from kronos_core.sizes import LARGE_PUBLISHED_PARAMS, SIZES, TOKENIZERS, build_model, build_tokenizer
from kronos_core.tokenizer import KronosTokenizer


def _stamps(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    highs = (60, 24, 7, 32, 13)
    return torch.stack([torch.randint(0, h, (batch, length), generator=g) for h in highs], dim=-1).float()


def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("size", ["mini", "small", "base"])
def test_published_parameter_counts(size):
    with torch.device("meta"):
        model = Kronos(**SIZES[size].model)
    assert count_parameters(model) == SIZES[size].published_params


def test_large_is_within_one_percent_and_documented():
    with torch.device("meta"):
        model = Kronos(**SIZES["large"].model)
    assert abs(count_parameters(model) - LARGE_PUBLISHED_PARAMS) / LARGE_PUBLISHED_PARAMS < 0.01
    assert "approximation" in SIZES["large"].note


def test_base_tokenizer_parameter_count():
    assert count_parameters(KronosTokenizer(**TOKENIZERS["base"])) == 3_958_042


def test_state_dict_keys_follow_published_layout():
    model = build_model("mini")
    keys = set(model.state_dict())
    for key in ("embedding.emb_s1.weight", "embedding.fusion_proj.bias", "time_emb.minute_embed.weight",
                "transformer.3.self_attn.rotary.inv_freq", "transformer.0.ffn.w3.weight", "norm.weight",
                "dep_layer.cross_attn.q_proj.weight", "dep_layer.norm.weight", "head.proj_s2.bias"):
        assert key in keys
    assert model.state_dict()["embedding.emb_s1.weight"].shape == (1024, 256)
    tokenizer_keys = set(build_tokenizer("base").state_dict())
    assert {"tokenizer.bsq.basis", "tokenizer.bsq.group_basis", "encoder.2.norm1.weight",
            "post_quant_embed_pre.weight", "head.bias"} <= tokenizer_keys
    assert "encoder.3.norm1.weight" not in tokenizer_keys  # n_enc_layers - 1 blocks


def test_forward_shapes_and_dtypes():
    model = build_model("tiny").eval()
    s1 = torch.randint(0, 1024, (2, 17))
    s2 = torch.randint(0, 1024, (2, 17))
    s1_logits, s2_logits = model(s1, s2, _stamps(2, 17), use_teacher_forcing=True, s1_targets=s1)
    assert s1_logits.shape == (2, 17, 1024) and s2_logits.shape == (2, 17, 1024)
    assert s1_logits.dtype == torch.float32
    logits, context = model.decode_s1(s1, s2, _stamps(2, 17))
    assert context.shape == (2, 17, 32)
    assert model.decode_s2(context, s1[:, -1:]).shape == (2, 17, 1024)


def test_predictor_is_causal():
    model = build_model("tiny").eval()
    s1 = torch.randint(0, 1024, (1, 12))
    s2 = torch.randint(0, 1024, (1, 12))
    changed = s1.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 1024
    with torch.no_grad():
        a, _ = model.decode_s1(s1, s2)
        b, _ = model.decode_s1(changed, s2)
    assert torch.equal(a[:, :-1], b[:, :-1])
    assert not torch.equal(a[:, -1], b[:, -1])


@pytest.mark.parametrize("padded", [False, True])
def test_teacher_forced_s2_logits_are_causal_in_eval(padded):
    """The quality guard's validation loss is teacher-forced in eval mode: position t of s2 must not see the
    window's later positions (the published layer is causal in training only)."""
    model = build_model("tiny", seed=1).eval()
    g = torch.Generator().manual_seed(5)
    s1, s2 = torch.randint(0, 1024, (2, 16), generator=g), torch.randint(0, 1024, (2, 16), generator=g)
    stamps = _stamps(2, 16)
    pad = torch.zeros(2, 16, dtype=torch.long) if padded else None
    with torch.no_grad():
        _, full = model(s1, s2, stamps, padding_mask=pad, use_teacher_forcing=True, s1_targets=s1)
        for end in (4, 9, 15):
            short_pad = None if pad is None else pad[:, :end]
            _, cut = model(s1[:, :end], s2[:, :end], stamps[:, :end], padding_mask=short_pad,
                           use_teacher_forcing=True, s1_targets=s1[:, :end])
            torch.testing.assert_close(cut, full[:, :end], rtol=1e-5, atol=1e-5)


def test_padding_mask_hides_padded_keys():
    model = build_model("tiny").eval()
    s1 = torch.randint(0, 1024, (1, 10))
    s2 = torch.randint(0, 1024, (1, 10))
    pad = torch.zeros(1, 10, dtype=torch.long)
    pad[0, :3] = 1
    other = s1.clone()
    other[0, :3] = (other[0, :3] + 7) % 1024
    with torch.no_grad():
        a, _ = model.decode_s1(s1, s2, padding_mask=pad)
        b, _ = model.decode_s1(other, s2, padding_mask=pad)
    assert torch.allclose(a[:, 3:], b[:, 3:], atol=1e-5)
    assert torch.isfinite(a).all()


def test_tokenizer_indices_and_bits_round_trip():
    tokenizer = build_tokenizer("tiny").eval()
    x = torch.randn(3, 20, 6)
    s1, s2 = tokenizer.encode(x, half=True)
    assert s1.dtype == torch.long and s1.shape == (3, 20)
    assert int(s1.max()) < 1024 and int(s1.min()) >= 0
    full = tokenizer.encode(x)
    assert torch.equal(full, s1 + (s2 << 10))  # s1 holds the low bits of the full index
    bits = tokenizer.indices_to_bits([s1, s2], half=True)
    assert torch.allclose(bits.abs(), torch.full_like(bits, 1 / math.sqrt(20)))
    assert torch.equal(tokenizer.tokenizer.bits_to_indices(bits[..., :10]), s1)
    assert tokenizer.decode([s1, s2], half=True).shape == (3, 20, 6)



@pytest.mark.parametrize("size", ["tiny", "mini"])
def test_decoding_only_the_tail_equals_the_whole_decode_cut(size):
    """decode(last=k) runs the last decoder block for the tail only: the same features as the whole decode's
    last k positions, to float32 rounding, and a different answer where the tail is wrong."""
    tokenizer = build_tokenizer(size).eval()
    torch.manual_seed(3)
    s1, s2 = tokenizer.encode(torch.randn(4, 40, 6), half=True)
    with torch.inference_mode():
        whole = tokenizer.decode([s1, s2], half=True)
        for last in (1, 7, 40, 64):
            tail = tokenizer.decode([s1, s2], half=True, last=last)
            assert tail.shape == (4, min(last, 40), 6)
            torch.testing.assert_close(tail, whole[:, -last:], rtol=1e-5, atol=1e-5)
        changed = s1.clone()
        changed[:, 30] = (changed[:, 30] + 1) % 1024  # a position inside the tail's causal past
        assert not torch.allclose(tokenizer.decode([changed, s2], half=True, last=7), whole[:, -7:])

def test_tokenizer_training_forward_has_finite_loss_and_gradients():
    tokenizer = build_tokenizer("tiny").train()
    x = torch.randn(4, 16, 6)
    (rec_s1, rec_all), bsq_loss, quantized, indices = tokenizer(x)
    loss = (torch.nn.functional.mse_loss(rec_s1, x) + torch.nn.functional.mse_loss(rec_all, x) + bsq_loss) / 2
    loss.backward()
    assert torch.isfinite(loss)
    assert tokenizer.embed.weight.grad is not None and tokenizer.embed.weight.grad.abs().sum() > 0


def test_activation_checkpointing_gives_same_gradients():
    torch.manual_seed(0)
    model = build_model("tiny").train()
    model.token_drop.p = 0.0
    s1 = torch.randint(0, 1024, (2, 12))
    s2 = torch.randint(0, 1024, (2, 12))

    def grads(every_n):
        model.zero_grad(set_to_none=True)
        model.set_activation_checkpointing(every_n)
        a, b = model(s1, s2, use_teacher_forcing=True, s1_targets=s1)
        model.head.compute_loss(a, b, s1, s2)[0].backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain, checkpointed = grads(0), grads(1)
    assert all(torch.allclose(p, c, atol=1e-6) for p, c in zip(plain, checkpointed))


def test_save_and_load_round_trip_is_bit_identical(tmp_path):
    model = build_model("tiny", seed=3)
    model.save_pretrained(tmp_path / "predictor")
    loaded = Kronos.from_pretrained(tmp_path / "predictor")
    assert json.loads((tmp_path / "predictor" / CONFIG_NAME).read_text()) == SIZES["tiny"].model
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    tokenizer = build_tokenizer("tiny", seed=4)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    again = KronosTokenizer.from_pretrained(tmp_path / "tokenizer")
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in tokenizer.state_dict().items())


def test_missing_config_is_named(tmp_path):
    build_model("tiny").save_pretrained(tmp_path)
    (tmp_path / CONFIG_NAME).unlink()
    with pytest.raises(KronosError, match="has no config.json"):
        Kronos.from_pretrained(tmp_path)


def test_truncated_weights_are_named(tmp_path):
    build_model("tiny").save_pretrained(tmp_path)
    weights = tmp_path / WEIGHTS_NAME
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(KronosError, match="truncated"):
        Kronos.from_pretrained(tmp_path)


def test_mismatched_key_and_shape_are_named(tmp_path):
    build_model("tiny").save_pretrained(tmp_path)
    weights = tmp_path / WEIGHTS_NAME
    state = load_safetensors(weights)
    state["norm.scale"] = state.pop("norm.weight")
    save_safetensors(state, weights)
    with pytest.raises(KronosError, match="lacks weight 'norm.weight'"):
        Kronos.from_pretrained(tmp_path)
    state["norm.weight"] = torch.ones(7)
    del state["norm.scale"]
    save_safetensors(state, weights)
    with pytest.raises(KronosError, match=r"'norm.weight' has shape \(7,\)"):
        Kronos.from_pretrained(tmp_path)


def test_config_of_the_wrong_model_is_named(tmp_path):
    build_tokenizer("tiny").save_pretrained(tmp_path)
    with pytest.raises(KronosError, match="lacks .* needed by Kronos"):
        Kronos.from_pretrained(tmp_path)
