"""In-place arguments that share memory are refused with a clear error (x and residual, q and k, the
two caches), views that do not overlap are accepted (q, k split from one qkv tensor), and on CPU
reshape_and_cache refuses a slot used twice. Fakes validate like the kernels (meta tensors)."""

from __future__ import annotations

import pytest
import torch

from keel import ops


def test_fused_add_rms_norm_x_and_residual_alias():
    x = torch.randn(4, 8)
    w = torch.ones(8)
    with pytest.raises(
        RuntimeError,
        match=r"keel::fused_add_rms_norm: x and residual share memory, but x is "
        r"written in place",
    ):
        ops.fused_add_rms_norm(x, x, w, 1e-6)
    buf = torch.randn(4, 16)
    with pytest.raises(RuntimeError, match="x and residual share memory"):
        ops.fused_add_rms_norm(buf[:, :8], buf[:, 4:12], w, 1e-6)  # overlapping column windows
    with pytest.raises(RuntimeError, match="x and weight share memory"):
        ops.fused_add_rms_norm(buf[:, :8], torch.randn(4, 8), buf[0, :8], 1e-6)
    ops.fused_add_rms_norm(buf[:, :8], buf[:, 8:], w, 1e-6)  # interleaved but disjoint: fine


def test_rotary_q_k_views():
    pos = torch.arange(3)
    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    f = torch.outer(torch.arange(4).float(), inv)
    cache = torch.cat([f.cos(), f.sin()], -1)
    qkv = torch.randn(3, 48)
    ops.rotary_embedding(pos, qkv[:, :16], qkv[:, 16:32], 8, cache, True)  # split views: accepted
    q = torch.randn(3, 16)
    with pytest.raises(RuntimeError, match=r"keel::rotary_embedding: q and k share memory, but q is written in place"):
        ops.rotary_embedding(pos, q, q, 8, cache, True)
    with pytest.raises(RuntimeError, match=r"keel::rotary_embedding: q and k share memory"):
        ops.rotary_embedding(pos, qkv[:, :16], qkv[:, 8:24], 8, cache, True)
    with pytest.raises(RuntimeError, match=r"q and cos_sin_cache share memory"):
        ops.rotary_embedding(pos, cache[:3, :8], torch.randn(3, 8), 8, cache, True)


def _caches():
    return torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8)


def test_reshape_and_cache_cache_alias_and_duplicate_slots():
    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    kc, vc = _caches()
    with pytest.raises(RuntimeError, match=r"keel::reshape_and_cache: key_cache and value_cache share memory"):
        ops.reshape_and_cache(key, value, kc, kc, torch.tensor([0, 1, 2]))
    with pytest.raises(
        RuntimeError,
        match=r"keel::reshape_and_cache: slot_mapping\[0\] and slot_mapping\[2\] are both 5; "
        r"each cache slot may be written by one token only",
    ):
        ops.reshape_and_cache(key, value, kc, vc, torch.tensor([5, 1, 5]))
    with pytest.raises(RuntimeError, match=r"slot_mapping\[1\] and slot_mapping\[2\] are both 3"):
        ops.reshape_and_cache(key, value, kc, vc, torch.tensor([4, 3, 3]))
    ops.reshape_and_cache(key, value, kc, vc, torch.tensor([-1, 6, -1]))  # padding may repeat
    ops.reshape_and_cache(key, value, kc, vc, torch.tensor([7, 2, 0]))  # unordered, distinct: fine
    assert torch.equal(kc.view(-1, 2, 8)[[7, 2, 0]], key)


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda m: ops.linear(torch.empty((), device=m), torch.empty(4, 1, device=m)),
            r"keel::linear: x must have at least 1 dimension\(s\), got 0-D",
        ),
        (
            lambda m: ops.linear(torch.empty(2, 3, device=m), torch.empty(4, 5, device=m)),
            r"keel::linear: weight must be \[N, 3\] to match x's last dim, got \[4, 5\]",
        ),
        (
            lambda m: ops.linear(torch.empty(2, 3, device=m), torch.empty(3, 4, device=m).t()),
            r"keel::linear: weight must have unit stride along its last dim",
        ),
        (
            lambda m: ops.rms_norm(torch.empty(2, 3, device=m, dtype=torch.int64), torch.empty(3, device=m), 1e-6),
            r"keel::rms_norm: x must be float32, bfloat16 or float16, got int64",
        ),
        (
            lambda m: ops.rms_norm(torch.empty(2, 3, device=m), torch.empty(3, device=m), float("nan")),
            r"keel::rms_norm: eps must be a non-negative number",
        ),
        (
            lambda m: ops.silu_and_mul(torch.empty((), device=m)),
            r"keel::silu_and_mul: x must have at least 1 dimension",
        ),
        (
            lambda m: ops.fused_muladd(torch.empty(2, device=m), None, 1.0),
            r"keel::fused_muladd: b must be a tensor, got an undefined tensor \(None\)",
        ),
        (
            lambda m: ops.rotary_embedding(
                torch.zeros(2, dtype=torch.int32, device=m),
                torch.empty(2, 8, device=m),
                torch.empty(2, 8, device=m),
                8,
                torch.empty(4, 8, device=m),
                True,
            ),
            r"keel::rotary_embedding: positions must be int64, got int32",
        ),
        (
            lambda m: ops.rotary_embedding(
                torch.zeros(2, dtype=torch.int64, device=m),
                torch.empty(2, 8, device=m),
                torch.empty(2, 8, device=m),
                -8,
                torch.empty(4, 8, device=m),
                True,
            ),
            r"keel::rotary_embedding: head_size must be positive, got -8",
        ),
        (
            lambda m: ops.reshape_and_cache(
                torch.empty(3, 2, 8, device=m),
                torch.empty(3, 2, 8, device=m),
                torch.empty(2, 4, 2, 8, device=m),
                torch.empty(2, 4, 2, 8, device=m),
                torch.zeros(2, dtype=torch.int64, device=m),
            ),
            r"keel::reshape_and_cache: slot_mapping must be 1-D with one slot per token \(3\), got shape \[2\]",
        ),
        (
            lambda m: ops.fused_add_rms_norm(
                torch.empty(2, 8, device=m), torch.empty(2, 7, device=m), torch.empty(8, device=m), 1e-6
            ),
            r"keel::fused_add_rms_norm: residual must have the shape of x \[2, 8\], got \[2, 7\]",
        ),
    ],
)
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_fake_and_kernel_refuse_alike(call, match, device):
    with pytest.raises(RuntimeError, match=match):
        call(device)
