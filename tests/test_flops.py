"""FLOPs per token from a size's closed form: equal to the count on the built model, for every size."""

from __future__ import annotations

import pytest
import torch

from kronos_core.model import Kronos
from kronos_core.sizes import SIZES, non_embedding_params
from kronos_tune.profiling.flops import non_embedding_parameters, size_train_flops_per_token, train_flops_per_token


@pytest.mark.parametrize("size", sorted(SIZES))
def test_the_closed_form_counts_what_the_model_holds(size: str) -> None:
    spec = SIZES[size].model
    with torch.device("meta"):
        model = Kronos(**spec)
    assert non_embedding_params(spec) == non_embedding_parameters(model)
    for tokens in (1, 512, 2048):
        assert size_train_flops_per_token(spec, tokens) == train_flops_per_token(model, tokens)


def test_the_closed_form_follows_each_dimension() -> None:
    """A changed ff_dim, layer count or vocabulary moves the closed form as it moves the model."""
    base = SIZES["tiny"].model
    for change in ({"ff_dim": 96}, {"n_layers": 5}, {"s1_bits": 8, "s2_bits": 6}, {"d_model": 48, "n_heads": 4}):
        spec = {**base, **change}
        with torch.device("meta"):
            model = Kronos(**spec)
        assert non_embedding_params(spec) == non_embedding_parameters(model) != non_embedding_params(base)
