"""Named Kronos sizes with their tokenizers, and random-init builders."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kronos_core.errors import KronosError

if TYPE_CHECKING:  # the builders import torch; the table of sizes needs none (reports, presets, configs)
    from kronos_core.model import Kronos
    from kronos_core.tokenizer import KronosTokenizer


@dataclass(frozen=True)
class SizeSpec:
    model: dict
    tokenizer: str
    context: int
    published_params: int | None
    note: str = ""


def _predictor(d_model: int, n_layers: int, n_heads: int, ff_dim: int, ffn: float = 0.0, attn: float = 0.0,
               resid: float = 0.0, token: float = 0.0) -> dict:
    return dict(s1_bits=10, s2_bits=10, n_layers=n_layers, d_model=d_model, n_heads=n_heads, ff_dim=ff_dim,
                ffn_dropout_p=ffn, attn_dropout_p=attn, resid_dropout_p=resid, token_dropout_p=token,
                learn_te=True)


def _tokenizer(d_model: int, n_heads: int, ff_dim: int, layers: int, group_size: int) -> dict:
    return dict(d_in=6, d_model=d_model, n_heads=n_heads, ff_dim=ff_dim, n_enc_layers=layers,
                n_dec_layers=layers, ffn_dropout_p=0.0, attn_dropout_p=0.0, resid_dropout_p=0.0,
                s1_bits=10, s2_bits=10, beta=0.05, gamma0=1.0, gamma=1.1, zeta=0.05, group_size=group_size)


TOKENIZERS: dict[str, dict] = {
    "base": _tokenizer(256, 4, 512, 4, group_size=4),
    "2k": _tokenizer(256, 4, 512, 4, group_size=5),
    # Test-only: seconds to train on a laptop CPU.
    "tiny": _tokenizer(32, 2, 64, 3, group_size=4),
}

SIZES: dict[str, SizeSpec] = {
    "mini": SizeSpec(_predictor(256, 4, 4, 512), "2k", 2048, 4_108_032),
    "small": SizeSpec(_predictor(512, 8, 8, 1024, ffn=0.25, attn=0.1, resid=0.25, token=0.1), "base", 512,
                      24_741_376),
    "base": SizeSpec(_predictor(832, 12, 16, 2048, ffn=0.2, resid=0.2), "base", 512, 102_310_592),
    "large": SizeSpec(_predictor(1664, 15, 16, 4160, ffn=0.2, resid=0.2), "base", 512, None,
                      note="approximation: the published 499.2M model's dimensions are not public; "
                           "d_model 1664, 15 layers, 16 heads, ff_dim 4160 (base's ff/d ratio) give 501,453,440 "
                           "parameters, +0.45% of the stated 499.2M"),
    "tiny": SizeSpec(_predictor(32, 2, 2, 64), "tiny", 512, None, note="test-only size"),
}

LARGE_PUBLISHED_PARAMS = 499_200_000


def non_embedding_params(model: dict) -> int:
    """Parameters of a predictor built from `model` (a size's or a config.json's keywords) outside its
    embedding tables, from the layer shapes alone: what FLOPs per token are counted from, without torch.
    tests/test_flops.py checks it against the built model for every size."""
    d, ff, layers = model["d_model"], model["ff_dim"], model["n_layers"]
    vocab = 2 ** model["s1_bits"] + 2 ** model["s2_bits"]
    attention = 4 * (d * d + d)  # q, k, v and out projections, with biases
    block = attention + 3 * d * ff + 2 * d  # + the gated feed-forward (no biases) + two RMSNorms
    fusion = 2 * d * d + d  # the s1/s2 embeddings' fusion projection
    dependency = attention + d  # the dependency layer's cross-attention and norm
    heads = d * vocab + vocab  # the s1 and s2 output projections
    return fusion + layers * block + d + dependency + heads


def size_spec(name: str) -> SizeSpec:
    if name not in SIZES:
        raise KronosError(f"unknown model size '{name}'; choose one of {', '.join(SIZES)}")
    return SIZES[name]


def build_model(name: str, seed: int | None = 0) -> Kronos:
    """A randomly initialized predictor of a named size (deterministic with a seed)."""
    import torch

    from kronos_core.model import Kronos

    spec = size_spec(name)
    if seed is not None:
        torch.manual_seed(seed)
    return Kronos(**spec.model)


def build_tokenizer(name: str, seed: int | None = 0) -> KronosTokenizer:
    """A randomly initialized tokenizer: a tokenizer name ('base', '2k', 'tiny') or a model size."""
    import torch

    from kronos_core.tokenizer import KronosTokenizer

    key = SIZES[name].tokenizer if name in SIZES else name
    if key not in TOKENIZERS:
        raise KronosError(f"unknown tokenizer '{name}'; choose one of {', '.join(TOKENIZERS)} or a model size")
    if seed is not None:
        torch.manual_seed(seed)
    return KronosTokenizer(**TOKENIZERS[key])

