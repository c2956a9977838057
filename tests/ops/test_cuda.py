"""keel's 7 ops on CUDA against their CPU twins and float64 references: every dtype, contiguous,
strided and transposed inputs, empty tensors, aliased in-place arguments refused, a non-default stream;
the device-side range checks (rotary positions, cache slots) in a child process, where a bad index
must assert and write nothing. Skipped without a GPU: no GPU has run these yet (compiled, not run).

Tolerances against float64 (computed on the CPU from the same rounded inputs): the output dtype's
rounding, twice where the kernel rounds an intermediate as Hugging Face's Llama does (rms_norm's
normalized value, silu before the multiply): float32 1e-5, bfloat16 1.6e-2, float16 2e-3 (relative,
the same absolute). Against the CPU twin: 16-bit results may differ in at most 1% of elements, by at
most 1 ulp (3 for the ops that round an intermediate), as two correct roundings of fp32 sums do.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from support.devices import DTYPES, HAS_CUDA, assert_rounded_like
from support.layouts import LAYOUTS, make

from keel import ops

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")]

TOL64 = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float64: 1e-12}


def close64(actual: torch.Tensor, expected64: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    """`actual` (any device) within the dtype's tolerance of a float64 reference."""
    tol = TOL64[dtype] * scale
    torch.testing.assert_close(actual.cpu().double(), expected64.double(), rtol=tol, atol=tol)


def twin(cuda_out: torch.Tensor, cpu_out: torch.Tensor, dtype: torch.dtype, max_ulps: float = 1) -> None:
    """The CUDA result agrees with the CPU kernel's as two correct roundings do (float32: 1e-6)."""
    if dtype in (torch.float32, torch.float64):
        torch.testing.assert_close(cuda_out.cpu(), cpu_out, rtol=1e-6, atol=1e-6)
    else:
        assert_rounded_like(cuda_out.cpu(), cpu_out, dtype, max_ulps=max_ulps)


def to_cuda(t: torch.Tensor) -> torch.Tensor:
    """A CUDA copy with t's strides (a strided input stays strided)."""
    dev = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="cuda")
    dev.copy_(t)
    return dev


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float64])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(1000,), (7, 33), (3, 1, 130), (0, 5)], ids=str)
def test_fused_muladd(dtype, layout, shape):
    a, b = make(shape, dtype, "cpu", layout, seed=1), make(shape, dtype, "cpu", layout, seed=2)
    out = ops.fused_muladd(to_cuda(a), to_cuda(b), 0.75)
    assert out.is_cuda and out.shape == a.shape and out.dtype == dtype
    twin(out, ops.fused_muladd(a, b, 0.75), dtype)
    close64(out, a.double() * b.double() + 0.75, dtype)


def rms64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(3, 64), (5, 7, 33), (2, 4096), (0, 16)], ids=str)
def test_rms_norm(dtype, layout, shape):
    x, w = make(shape, dtype, "cpu", layout, seed=3), make((shape[-1],), dtype, "cpu", "contiguous", seed=4)
    out = ops.rms_norm(to_cuda(x), w.cuda(), 1e-6)
    assert out.is_cuda and out.shape == x.shape and out.is_contiguous()
    twin(out, ops.rms_norm(x, w, 1e-6), dtype, max_ulps=3)
    close64(out, rms64(x, w, 1e-6), dtype, scale=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(4, 64), (3, 2, 576), (0, 8)], ids=str)
def test_fused_add_rms_norm(dtype, layout, shape):
    x, res = make(shape, dtype, "cpu", layout, seed=5), make(shape, dtype, "cpu", layout, seed=6)
    w = make((shape[-1],), dtype, "cpu", "contiguous", seed=7)
    xc, rc = to_cuda(x), to_cuda(res)
    ops.fused_add_rms_norm(xc, rc, w.cuda(), 1e-5)
    summed64 = x.double() + res.double()
    x_cpu, r_cpu = x.clone(), res.clone()
    ops.fused_add_rms_norm(x_cpu, r_cpu, w, 1e-5)
    twin(rc, r_cpu, dtype)
    twin(xc, x_cpu, dtype, max_ulps=3)
    close64(rc, summed64, dtype)
    close64(xc, rms64(r_cpu, w, 1e-5), dtype, scale=2)  # normalizes the rounded sum, as the kernel does


def rope_cache(max_pos: int, rot: int, dtype: torch.dtype) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    f = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv)
    return torch.cat([f.cos(), f.sin()], -1).to(dtype)


def rope64(positions, x, heads, head_size, cache, is_neox) -> torch.Tensor:
    xs = x.double().reshape(*positions.shape, heads, head_size)
    rot = cache.shape[-1]
    cos, sin = (c.unsqueeze(-2) for c in cache.double()[positions].chunk(2, -1))
    xr, xp = xs[..., :rot], xs[..., rot:]
    if is_neox:
        x1, x2 = xr.chunk(2, -1)
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2)
    return torch.cat([out, xp], -1).reshape(x.shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("cache_fp32", [True, False])
@pytest.mark.parametrize(
    "case", [((5,), 4, 2, 16, 16), ((2, 3), 9, 3, 64, 64), ((7,), 2, 2, 32, 16), ((0,), 2, 1, 8, 8)]
)
def test_rotary_embedding(dtype, is_neox, cache_fp32, case):
    pos_shape, heads, kv, hs, rot = case
    g = torch.Generator().manual_seed(8)
    positions = torch.randint(0, 40, pos_shape, generator=g)
    qkv = torch.randn(*pos_shape, (heads + 2 * kv) * hs, generator=g).to(dtype)  # q, k: views of one qkv
    cache = rope_cache(40, rot, torch.float32 if cache_fp32 else dtype)
    qkv_cuda = qkv.to("cuda", copy=True)
    q, k = qkv_cuda[..., : heads * hs], qkv_cuda[..., heads * hs : (heads + kv) * hs]
    ops.rotary_embedding(positions.cuda(), q, k, hs, cache.cuda(), is_neox)
    q_cpu, k_cpu = qkv[..., : heads * hs].clone(), qkv[..., heads * hs : (heads + kv) * hs].clone()
    ops.rotary_embedding(positions, q_cpu, k_cpu, hs, cache, is_neox)
    twin(q, q_cpu, dtype)
    twin(k, k_cpu, dtype)
    close64(q, rope64(positions, qkv[..., : heads * hs], heads, hs, cache, is_neox), dtype)
    close64(k, rope64(positions, qkv[..., heads * hs : (heads + kv) * hs], kv, hs, cache, is_neox), dtype)
    assert torch.equal(qkv_cuda[..., (heads + kv) * hs :].cpu(), qkv[..., (heads + kv) * hs :])  # v untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(3, 16), (2, 5, 3072), (0, 8)], ids=str)
def test_silu_and_mul(dtype, layout, shape):
    x = make(shape, dtype, "cpu", layout, seed=9)
    out = ops.silu_and_mul(to_cuda(x))
    twin(out, ops.silu_and_mul(x), dtype, max_ulps=3)
    g, u = x.double().chunk(2, -1)
    close64(out, torch.nn.functional.silu(g) * u, dtype, scale=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("strided_src", [False, True])
@pytest.mark.parametrize("case", [(5, 2, 8, 4, 4), (37, 3, 64, 4, 16), (0, 2, 8, 2, 4)])
def test_reshape_and_cache_writes_exactly_the_slots(dtype, strided_src, case):
    t, kv, d, nb, bs = case
    g = torch.Generator().manual_seed(10)
    qkv = torch.randn(t, 3 * kv * d, generator=g).to(dtype)
    if strided_src:  # k and v as column slices of one qkv projection output (row stride 3 * kv * d)
        key, value = qkv[:, kv * d : 2 * kv * d].view(t, kv, d), qkv[:, 2 * kv * d :].view(t, kv, d)
    else:
        key, value = qkv[:, : kv * d].reshape(t, kv, d).clone(), qkv[:, kv * d : 2 * kv * d].reshape(t, kv, d).clone()
    slots = torch.randperm(nb * bs, generator=g)[:t]
    if t > 2:
        slots[1] = -1  # padding: skipped
    kc, vc = torch.full((nb, bs, kv, d), 7.0, dtype=dtype), torch.full((nb, bs, kv, d), -7.0, dtype=dtype)
    kc_gpu, vc_gpu = kc.cuda(), vc.cuda()
    ops.reshape_and_cache(to_cuda(key), to_cuda(value), kc_gpu, vc_gpu, slots.cuda())
    ops.reshape_and_cache(key, value, kc, vc, slots)
    assert torch.equal(kc_gpu.cpu(), kc) and torch.equal(vc_gpu.cpu(), vc)  # a copy: bit for bit
    keep = slots >= 0
    assert torch.equal(kc.view(-1, kv, d)[slots[keep]], key[keep])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 96, 64), (33, 130, 200), (0, 16, 8)])
def test_linear(dtype, bias, m, n, k):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    out = ops.linear(x.cuda(), w.cuda(), None if b is None else b.cuda())
    ref = x.double() @ w.double().T + (0 if b is None else b.double())
    close64(out, ref, dtype, scale=2)  # cuBLAS: fp32 accumulation, one rounding of the output
    torch.testing.assert_close(out.cpu().double(), ops.linear(x, w, b).double(), **_linear_twin_tol(dtype))


def _linear_twin_tol(dtype: torch.dtype) -> dict[str, float]:
    tol = {torch.float32: 1e-4, torch.bfloat16: 3.2e-2, torch.float16: 4e-3}[dtype]  # both within 2 tol of fp64
    return {"rtol": tol, "atol": tol}


def test_aliased_in_place_arguments_refused():
    x, w = torch.randn(4, 8, device="cuda"), torch.ones(8, device="cuda")
    with pytest.raises(RuntimeError, match=r"keel::fused_add_rms_norm: x and residual share memory"):
        ops.fused_add_rms_norm(x, x, w, 1e-6)
    q, pos, cache = torch.randn(3, 16, device="cuda"), torch.arange(3, device="cuda"), rope_cache(4, 8, torch.float32)
    with pytest.raises(RuntimeError, match=r"keel::rotary_embedding: q and k share memory"):
        ops.rotary_embedding(pos, q, q, 8, cache.cuda(), True)
    kc = torch.zeros(2, 4, 2, 8, device="cuda")
    key = torch.randn(3, 2, 8, device="cuda")
    with pytest.raises(RuntimeError, match=r"keel::reshape_and_cache: key_cache and value_cache share memory"):
        ops.reshape_and_cache(key, key.clone(), kc, kc, torch.tensor([0, 1, 2], device="cuda"))


def test_other_stream_orders_with_its_own_work():
    # work queued on a side stream must see that stream's earlier writes (the op runs on the current stream)
    side = torch.cuda.Stream()
    x = torch.randn(256, 4096, device="cuda")
    w = torch.randn(4096, device="cuda")
    big = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        # y waits for a ~ms matmul on `side`: an op launched on another stream would read it unfinished
        y = x * 3.0 + (big @ big)[:256, :1] * 0.0
        out = ops.rms_norm(y, w, 1e-6)
    side.synchronize()
    close64(out, rms64(x.cpu() * 3.0, w.cpu(), 1e-6), torch.float32, scale=10)


def test_mixed_devices_refused():
    with pytest.raises(RuntimeError, match=r"keel::rms_norm: weight must be on the device of x \(cuda:0\), got cpu"):
        ops.rms_norm(torch.randn(2, 8, device="cuda"), torch.randn(8), 1e-6)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_devices_refused():
    with pytest.raises(RuntimeError, match=r"keel::rms_norm: weight must be on the device of x \(cuda:0\), got cuda:1"):
        ops.rms_norm(torch.randn(2, 8, device="cuda:0"), torch.randn(8, device="cuda:1"), 1e-6)


# The child: the key cache in pinned host memory mapped into the device (unified addressing), followed by
# 4 guard rows, so it can be read after the device-side assert has made the CUDA context unusable. A valid
# call first proves the mapping works (its writes show up on the host).
_CHILD = textwrap.dedent(
    """
    import json, sys, torch
    from keel import ops

    class Mapped:  # a CUDA view of pinned host memory
        def __init__(self, host):
            self.__cuda_array_interface__ = {"shape": tuple(host.shape), "typestr": "<f4", "strides": None,
                                             "data": (host.data_ptr(), False), "version": 3}

    which = sys.argv[1]
    host = torch.full((12, 16), 5.0).pin_memory()  # 8 cache rows (2 blocks x 4 slots x 2 heads x 8) + 4 guard rows
    kc = torch.as_tensor(Mapped(host), device="cuda")[:8].view(2, 4, 2, 8)
    vc = torch.zeros(2, 4, 2, 8, device="cuda")
    key = torch.ones(2, 2, 8, device="cuda")
    ops.reshape_and_cache(key, key, kc, vc, torch.tensor([0, 1], device="cuda"))
    torch.cuda.synchronize()
    mapped = bool((host[:2] == 1).all() and (host[2:] == 5).all())
    err = ""
    try:
        if which == "slot":  # slot 9 of 8: the kernel must skip it (row 9 is a guard row); slot 3 is valid
            ops.reshape_and_cache(key * 2, key * 2, kc, vc, torch.tensor([3, 9], device="cuda"))
        else:  # position 6 of a 4-row cos_sin_cache (cos 2, sin 0: a rotated row doubles); k = cache rows 0-1
            cache = torch.cat([torch.full((4, 4), 2.0), torch.zeros(4, 4)], 1).cuda()
            ops.rotary_embedding(torch.tensor([0, 6], device="cuda"), torch.ones(2, 16, device="cuda"),
                                 kc.view(8, 16)[:2], 8, cache, True)
        torch.cuda.synchronize()
    except RuntimeError as e:
        err = str(e)
    print(json.dumps({"mapped": mapped, "error": err, "rows": [float(host[i].mean()) for i in range(12)]}))
    """
)


def _run_child(which: str, tmp_path) -> tuple[dict, str]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, which], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"child failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1]), proc.stdout + proc.stderr


def test_device_check_bad_slot_asserts_and_writes_nothing_outside(tmp_path):
    result, output = _run_child("slot", tmp_path)
    assert result["mapped"], "the host-mapped cache did not see a valid write: the test's setup, not the op"
    assert "device-side assert" in result["error"], result
    assert "slot_mapping entry is outside the cache's slots" in output
    rows = result["rows"]
    assert rows[:3] == [1.0, 1.0, 5.0] and rows[4:] == [5.0] * 8  # guard rows 8-11 (slot 9 is row 9) untouched
    assert rows[3] in (2.0, 5.0)  # slot 3 (valid) may or may not have landed before the kernel stopped


def test_device_check_bad_position_asserts_and_writes_nothing(tmp_path):
    result, output = _run_child("position", tmp_path)
    assert result["mapped"], "the host-mapped cache did not see a valid write: the test's setup, not the op"
    assert "device-side assert" in result["error"], result
    assert "a position is outside cos_sin_cache's rows" in output
    rows = result["rows"]
    assert rows[1] == 1.0 and rows[2:] == [5.0] * 10  # the bad token's k row is not rotated
    assert rows[0] in (1.0, 2.0)  # token 0 (valid) may or may not have landed
