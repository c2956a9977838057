"""Rotary position embedding: rotary_embedding (in place on q and k)."""

from __future__ import annotations

import torch

_rotary_embedding = torch.ops.keel.rotary_embedding.default


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """Rotate q and k in place by cos_sin_cache[positions] ([max_pos, rot_dim] = cat(cos, sin)).

    q is [*positions.shape, heads * head_size] or [*positions.shape, heads, head_size]; k likewise.
    is_neox rotates halves (Llama/HF layout); otherwise interleaved pairs (GPT-J).
    """
    _rotary_embedding(positions, q, k, head_size, cos_sin_cache, is_neox)


# Mutates q and k and returns nothing; the fake only validates what shapes can tell.
@torch.library.register_fake("keel::rotary_embedding")
def _(positions, q, k, head_size: int, cos_sin_cache, is_neox: bool) -> None:
    torch._check(head_size > 0, lambda: f"keel::rotary_embedding: head_size must be positive, got {head_size}")
    torch._check(cos_sin_cache.dim() == 2, lambda: "keel::rotary_embedding: cos_sin_cache must be 2-D "
                 f"[max_position, rot_dim], got shape {list(cos_sin_cache.shape)}")
