"""Binary Spherical Quantization (BSQ, arXiv 2406.07548) as the Kronos tokenizer uses it.

Only what the tokenizer needs: sign quantization on the unit sphere with a
straight-through gradient, the commitment loss and the entropy penalty.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


def _entropy(probs: Tensor, dim: int = -1) -> Tensor:
    return -(probs * torch.log(probs + 1e-8)).sum(dim=dim)


class BinarySphericalQuantizer(nn.Module):
    """Holds the published buffers (`basis`, `group_basis`) and computes the BSQ loss."""

    def __init__(self, embed_dim: int, beta: float, gamma0: float, gamma: float, zeta: float,
                 group_size: int = 9):
        super().__init__()
        if embed_dim % group_size:
            raise ValueError(f"codebook dimension {embed_dim} is not divisible by group_size {group_size}")
        self.embed_dim = embed_dim
        self.beta = beta
        self.gamma0 = gamma0
        self.gamma = gamma
        self.zeta = zeta
        self.group_size = group_size
        self.register_buffer("basis", 2 ** torch.arange(embed_dim - 1, -1, -1))
        self.register_buffer("group_basis", 2 ** torch.arange(group_size - 1, -1, -1))

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.embed_dim)

    def quantize(self, z: Tensor) -> Tensor:
        """Sign of z (+1 where > 0, else -1) with a straight-through gradient, scaled to the sphere."""
        hard = torch.where(z > 0, torch.ones_like(z), -torch.ones_like(z))
        return (z + (hard - z).detach()) * self.scale

    def loss(self, z: Tensor, zq: Tensor) -> Tensor:
        """Commitment loss plus zeta * (gamma0 * per-sample entropy - gamma * codebook entropy).

        Both entropies use the closed-form per-bit probabilities p = sigmoid(-4 z / sqrt(K)).
        The published implementation computes a soft assignment over groups of
        `group_size` bits but then overwrites it with these per-bit probabilities,
        so `group_size` has no effect on the loss; we reproduce that behaviour so
        finetuning a published tokenizer optimizes the same objective.
        """
        commitment = self.beta * torch.mean(((zq.detach() - z) ** 2).sum(dim=-1))
        p = torch.sigmoid(-4 * z * self.scale)
        bit_probs = torch.stack([p, 1 - p], dim=-1)
        per_sample = _entropy(bit_probs).sum(dim=-1).mean()
        mean_bit_probs = bit_probs.reshape(-1, *bit_probs.shape[-2:]).mean(dim=0)
        codebook_entropy = _entropy(mean_bit_probs).sum()
        return commitment + self.zeta * (self.gamma0 * per_sample - self.gamma * codebook_entropy)


class BSQuantizer(nn.Module):
    """L2-normalize, quantize by sign, and split the bits into the s1 and s2 indices."""

    def __init__(self, s1_bits: int, s2_bits: int, beta: float, gamma0: float, gamma: float,
                 zeta: float, group_size: int):
        super().__init__()
        self.s1_bits = s1_bits
        self.s2_bits = s2_bits
        self.codebook_dim = s1_bits + s2_bits
        self.bsq = BinarySphericalQuantizer(self.codebook_dim, beta, gamma0, gamma, zeta, group_size)

    @staticmethod
    def bits_to_indices(bits: Tensor) -> Tensor:
        """Index = sum_j [bit_j >= 0] * 2^j, least significant bit first."""
        weights = 2 ** torch.arange(bits.shape[-1], dtype=torch.long, device=bits.device)
        return ((bits >= 0).long() * weights).sum(-1)

    def forward(self, z: Tensor, half: bool = False, collect_metrics: bool = True):
        z = F.normalize(z, dim=-1)
        quantized = self.bsq.quantize(z)
        bsq_loss = self.bsq.loss(z, quantized) if collect_metrics else quantized.new_zeros(())
        if half:
            indices = [self.bits_to_indices(quantized[..., :self.s1_bits]),
                       self.bits_to_indices(quantized[..., self.s1_bits:])]
        else:
            indices = self.bits_to_indices(quantized)
        return bsq_loss, quantized, indices
