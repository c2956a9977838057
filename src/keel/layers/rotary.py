"""Rotary position embedding: the cos/sin table (llama3 scaling as in transformers) and the in-place
`rotary_embedding` op applied to q and k."""

from __future__ import annotations

import math

import torch
from torch import nn

from keel import ops
from keel.hf.config import RopeConfig


def rope_cos_sin_cache(
    rope: RopeConfig, head_dim: int, max_pos: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """[max_pos, head_dim] = cat(cos, sin), each head_dim/2 wide; llama3 scaling as in transformers."""
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.rope_type == "llama3":
        old_len = rope.original_max_position_embeddings
        low_wavelen = old_len / rope.low_freq_factor
        high_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)  # [P, D/2]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device=device, dtype=dtype)


class RotaryEmbedding(nn.Module):
    """NeoX-style rotary embedding, applied in place to q [T, H * D] and k [T, KV * D].

    One instance serves every layer of a model (the table is the same); `build` fills the table on the
    weights' device and dtype once they are loaded (a model is constructed on the meta device)."""

    def __init__(self, rope: RopeConfig, head_dim: int, max_position: int) -> None:
        super().__init__()
        self.rope, self.head_dim, self.max_position = rope, head_dim, max_position
        self.cos_sin_cache = torch.empty(0)  # [max_position, head_dim], set by build()

    def build(self, dtype: torch.dtype, device: torch.device) -> None:
        self.cos_sin_cache = rope_cos_sin_cache(self.rope, self.head_dim, self.max_position, dtype, device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
        ops.rotary_embedding(positions, q, k, self.head_dim, self.cos_sin_cache, True)
