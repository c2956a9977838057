"""keel::rotary_embedding (in place) against HF's rotate_half (NeoX) and GPT-J pairs."""

from __future__ import annotations

import pytest
import torch
from support.devices import DEVICES, DTYPES, assert_rounded_like

from keel import ops


def cos_sin_cache(max_pos: int, rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)  # [max_pos, rot_dim]


def reference_rotary_embedding(positions, x, head_size, cache, is_neox):
    """x: [*pos, heads*head_size] or [*pos, heads, head_size]; returns the rotated copy."""
    shape = x.shape
    heads = x.shape[-1] // head_size if x.dim() == positions.dim() + 1 else x.shape[-2]
    xs = x.float().reshape(*positions.shape, heads, head_size)
    rot = cache.shape[-1]
    cos, sin = cache[positions].float().chunk(2, dim=-1)  # [*pos, rot/2]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    xr, xp = xs[..., :rot], xs[..., rot:]
    if is_neox:
        x1, x2 = xr.chunk(2, dim=-1)
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    return torch.cat([out, xp], dim=-1).reshape(shape).to(x.dtype)


CASES = [
    # positions shape, heads, kv heads, head_size, rot_dim, 3-D heads layout
    ((5,), 4, 2, 16, 16, False),
    ((5,), 4, 2, 16, 16, True),
    ((2, 3), 3, 1, 8, 8, False),
    ((7,), 2, 2, 32, 16, False),  # partial rotary
    ((0,), 2, 1, 8, 8, False),
    ((9,), 9, 3, 64, 64, True),  # SmolLM2-135M shape
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("cache_dtype", ["float32", "same"])
def test_matches_reference(device, dtype, case, is_neox, cache_dtype):
    pos_shape, nh, nkv, hs, rot, three_d = case
    g = torch.Generator().manual_seed(11)
    cache = cos_sin_cache(64, rot).to(torch.float32 if cache_dtype == "float32" else dtype).to(device)
    positions = torch.randint(0, 64, pos_shape, generator=g).to(device)
    qshape = (*pos_shape, nh, hs) if three_d else (*pos_shape, nh * hs)
    kshape = (*pos_shape, nkv, hs) if three_d else (*pos_shape, nkv * hs)
    q = torch.randn(qshape, generator=g).to(dtype).to(device)
    k = torch.randn(kshape, generator=g).to(dtype).to(device)
    want_q = reference_rotary_embedding(positions, q, hs, cache, is_neox)
    want_k = reference_rotary_embedding(positions, k, hs, cache, is_neox)
    ops.rotary_embedding(positions, q, k, hs, cache, is_neox)
    assert_rounded_like(q, want_q, dtype)
    assert_rounded_like(k, want_k, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_views_of_one_qkv_buffer(device):
    # q and k as column slices of a fused qkv projection output: strided token rows
    t, nh, nkv, hs = 6, 4, 2, 16
    qkv = torch.randn(t, (nh + 2 * nkv) * hs, device=device)
    q, k = qkv[:, : nh * hs], qkv[:, nh * hs : (nh + nkv) * hs]
    v_before = qkv[:, (nh + nkv) * hs :].clone()
    positions = torch.arange(t, device=device)
    cache = cos_sin_cache(32, hs).to(device)
    want_q = reference_rotary_embedding(positions, q, hs, cache, True)
    want_k = reference_rotary_embedding(positions, k, hs, cache, True)
    ops.rotary_embedding(positions, q, k, hs, cache, True)
    torch.testing.assert_close(q, want_q)
    torch.testing.assert_close(k, want_k)
    assert torch.equal(qkv[:, (nh + nkv) * hs :], v_before)


def test_opcheck():
    args = (torch.arange(4), torch.randn(4, 32), torch.randn(4, 16), 8, cos_sin_cache(8, 8), True)
    torch.library.opcheck(torch.ops.keel.rotary_embedding.default, args)


def _call(positions=None, q=None, k=None, head_size=8, cache=None):
    positions = torch.arange(4) if positions is None else positions
    q = torch.randn(4, 16) if q is None else q
    k = torch.randn(4, 8) if k is None else k
    cache = cos_sin_cache(8, 8) if cache is None else cache
    ops.rotary_embedding(positions, q, k, head_size, cache, True)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"head_size": 6},
            r"keel::rotary_embedding: cos_sin_cache must be \[max_position, rot_dim\] with an even rot_dim <= head_size=6",
        ),
        ({"head_size": 0}, r"keel::rotary_embedding: head_size must be positive, got 0"),
        (
            {"q": torch.randn(4, 12), "head_size": 8},
            r"keel::rotary_embedding: q last dim \(12\) must be a multiple of head_size=8",
        ),
        ({"q": torch.randn(4, 2, 4)}, r"keel::rotary_embedding: q last dim must be head_size=8"),
        ({"k": torch.randn(5, 8)}, r"keel::rotary_embedding: k leading dims must equal positions \[4\]"),
        (
            {"positions": torch.arange(4, dtype=torch.int32)},
            r"keel::rotary_embedding: positions must be int64, got int32",
        ),
        (
            {"positions": torch.tensor([0, 1, 2, 8])},
            r"keel::rotary_embedding: positions\[3\]=8 is outside cos_sin_cache's 8 rows",
        ),
        ({"positions": torch.tensor([0, -1, 2, 3])}, r"keel::rotary_embedding: positions\[1\]=-1 is outside"),
        (
            {"k": torch.randn(4, 8).half()},
            r"keel::rotary_embedding: k must have the dtype of q \(float32\), got float16",
        ),
        (
            {"cache": cos_sin_cache(8, 8).double()},
            r"keel::rotary_embedding: cos_sin_cache must be float32 or the dtype of q",
        ),
        (
            {"q": torch.randn(1, 16).expand(4, 16)},
            r"keel::rotary_embedding: q is written in place but has overlapping elements",
        ),
    ],
)
def test_bad_inputs(kwargs, match):
    with pytest.raises(RuntimeError, match=match):
        _call(**kwargs)
