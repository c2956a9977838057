"""Rotary position embedding: rotary_embedding (in place on q and k)."""

from __future__ import annotations

import torch

from keel.ops import _checks as chk

_rotary_embedding = torch.ops.keel.rotary_embedding.default
_OP = "keel::rotary_embedding"


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
    is_neox rotates halves (Llama/HF layout); otherwise interleaved pairs (GPT-J). q and k may be
    views of one qkv tensor but must not share elements (refused with an error).
    """
    _rotary_embedding(positions, q, k, head_size, cos_sin_cache, is_neox)


def _check_heads(arg: str, t: torch.Tensor, positions: torch.Tensor, head_size: int) -> None:
    pd = positions.dim()
    chk.check(
        t.dim() in (pd + 1, pd + 2),
        f"{_OP}: {arg} must be [{'num_tokens' if pd == 1 else 'batch, seq'}, num_heads * head_size] or "
        f"[..., num_heads, head_size] to match positions {chk.shape(positions)}, got shape {chk.shape(t)}",
    )
    chk.check(
        tuple(t.shape[:pd]) == tuple(positions.shape),
        f"{_OP}: {arg} leading dims must equal positions {chk.shape(positions)}, got shape {chk.shape(t)}",
    )
    if t.dim() == pd + 2:
        chk.check(
            t.shape[-1] == head_size, f"{_OP}: {arg} last dim must be head_size={head_size}, got shape {chk.shape(t)}"
        )
    else:
        chk.check(
            t.shape[-1] % head_size == 0,
            f"{_OP}: {arg} last dim ({t.shape[-1]}) must be a multiple of head_size={head_size}",
        )


# Mutates q and k and returns nothing; the fake validates what shapes and dtypes can tell
# (positions' values are checked by the kernels: on the host on CPU, on the device on CUDA).
@torch.library.register_fake("keel::rotary_embedding")
def _(positions, q, k, head_size: int, cos_sin_cache, is_neox: bool) -> None:
    chk.same_device(_OP, "k", k, "q", q)
    chk.same_device(_OP, "positions", positions, "q", q)
    chk.same_device(_OP, "cos_sin_cache", cos_sin_cache, "q", q)
    chk.float_dtype(_OP, "q", q)
    chk.same_dtype(_OP, "k", k, "q", q)
    chk.check(positions.dtype == torch.int64, f"{_OP}: positions must be int64, got {chk.dtype_name(positions.dtype)}")
    chk.check(
        positions.dim() in (1, 2),
        f"{_OP}: positions must be 1-D [num_tokens] or 2-D [batch, seq], got shape {chk.shape(positions)}",
    )
    chk.check(head_size > 0, f"{_OP}: head_size must be positive, got {head_size}")
    chk.dim(_OP, "cos_sin_cache", cos_sin_cache, 2)
    rot = cos_sin_cache.shape[1]
    chk.check(
        rot > 0 and rot % 2 == 0 and rot <= head_size,
        f"{_OP}: cos_sin_cache must be [max_position, rot_dim] with an even rot_dim <= head_size={head_size}, "
        f"got shape {chk.shape(cos_sin_cache)}",
    )
    chk.check(
        cos_sin_cache.dtype in (torch.float32, q.dtype),
        f"{_OP}: cos_sin_cache must be float32 or the dtype of q ({chk.dtype_name(q.dtype)}), "
        f"got {chk.dtype_name(cos_sin_cache.dtype)}",
    )
    _check_heads("q", q, positions, head_size)
    _check_heads("k", k, positions, head_size)
    chk.not_same(_OP, "q", q, "k", k)
