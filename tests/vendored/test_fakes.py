"""The vendored ops' fakes give the kernels' errors: each bad call below is made on CPU tensors (the
adapter and the fork check it) and again on meta tensors of the same shapes, strides and dtypes (the
fake checks it); both must raise the same message, which names the op and the argument. Together with
tests/fuzz/test_fakes_match_kernels.py (fuzzed inputs) this covers every check the fakes mirror."""

from __future__ import annotations

import pytest
import torch

import keel.vendored.deep_gemm  # noqa: F401  (loads the libraries)
import keel.vendored.flash_attn  # noqa: F401

FA = torch.ops.keel_flash_attn
DG = torch.ops.keel_deep_gemm
FP8 = torch.float8_e4m3fn
I32 = torch.int32


def _meta(v):
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    return v


def _error(op, kwargs) -> str | None:
    try:
        op(**kwargs)
    except RuntimeError as exc:
        return str(exc)
    return None


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=I32)


def varlen(**over):
    args = dict(
        q=torch.randn(6, 4, 64),
        k=torch.randn(6, 2, 64),
        v=torch.randn(6, 2, 64),
        cu_seqlens_q=_cu([2, 4]),
        cu_seqlens_k=_cu([2, 4]),
        seqused_k=None,
        block_table=None,
        max_seqlen_q=4,
        max_seqlen_k=4,
        softmax_scale=0.125,
        causal=True,
        window_left=-1,
        window_right=-1,
        softcap=0.0,
        num_splits=0,
    )
    return FA.varlen_fwd.default, {**args, **over}


def paged_varlen(**over):
    cache = torch.randn(3, 4, 2, 64)
    paged = dict(
        k=cache,
        v=cache.clone(),
        cu_seqlens_k=None,
        seqused_k=torch.tensor([2, 4], dtype=I32),
        block_table=torch.tensor([[0], [1]], dtype=I32),
    )
    return varlen(**{**paged, **over})


def kvcache(**over):
    args = dict(
        q=torch.randn(2, 1, 4, 64),
        k_cache=torch.randn(3, 4, 2, 64),
        v_cache=torch.randn(3, 4, 2, 64),
        cache_seqlens=torch.tensor([3, 4], dtype=I32),
        block_table=torch.tensor([[0], [2]], dtype=I32),
        softmax_scale=0.125,
        causal=True,
        window_left=-1,
        window_right=-1,
        softcap=0.0,
        num_splits=0,
    )
    return FA.fwd_kvcache.default, {**args, **over}


def fp8_gemm(**over):
    m, n, k = 2, 130, 256
    args = dict(
        a=torch.randn(m, k).to(FP8),
        sfa=torch.ones(m, 2),
        b=torch.randn(n, k).to(FP8),
        sfb=torch.ones(2, 2),
        d=torch.empty(m, n),
        c=None,
        recipe_m=None,
        recipe_n=None,
        recipe_k=None,
        disable_ue8m0_cast=False,
    )
    return DG.fp8_gemm_nt.default, {**args, **over}


def bf16_gemm(**over):
    args = dict(a=torch.randn(2, 8).bfloat16(), b=torch.randn(3, 8).bfloat16(), d=torch.empty(2, 3), c=None)
    return DG.bf16_gemm_nt.default, {**args, **over}


def per_token(**over):
    return DG.per_token_cast_to_fp8.default, {"x": torch.randn(3, 200), "use_ue8m0": False, "gran_k": 128, **over}


def per_block(**over):
    return DG.per_block_cast_to_fp8.default, {"x": torch.randn(3, 200), "use_ue8m0": False, **over}


V, K, D = "keel_flash_attn::varlen_fwd", "keel_flash_attn::fwd_kvcache", "keel_deep_gemm"
CASES = [
    (
        varlen(q=torch.randn(6, 4, 64, 1, 1)),
        f"{V}: q must have 1 to 4 dimensions, got 5-D tensor of shape [6, 4, 64, 1, 1]",
    ),
    (varlen(q=torch.randn(6, 4, 64).to(torch.complex64)), f"{V}: q must be float32, bfloat16 or float16, got dtype#9"),
    (varlen(q=torch.zeros(6, 4, 64, dtype=I32)), f"{V}: q must be float32, bfloat16 or float16, got int32"),
    (varlen(cu_seqlens_q=_cu([2, 4]).float()), f"{V}: cu_seqlens_q must be int32, got float32"),
    (
        varlen(q=torch.randn(6, 4, 128)[..., ::2]),
        f"{V}: q must have a contiguous last dimension, got strides with stride(-1) = 2",
    ),
    (varlen(q=torch.randn(6, 6, 64)[:, :3]), f"{V}: number of heads in q (3) must be a multiple of the kv heads (2)"),
    (
        varlen(q=torch.randn(6, 514, 8), k=torch.randn(6, 2, 8), v=torch.randn(6, 2, 8)),
        f"{V}: at most 256 query heads per kv head are supported, got 257",
    ),
    (varlen(k=torch.randn(6, 2, 32), v=torch.randn(6, 2, 32)), f"{V}: k must have head_size 64, got shape [6, 2, 32]"),
    (
        varlen(cu_seqlens_q=torch.zeros(2, 2, dtype=I32)),
        f"{V}: cu_seqlens_q must be 1-D [batch_size + 1], got shape [2, 2]",
    ),
    (varlen(cu_seqlens_q=torch.zeros(6, dtype=I32)[::2]), f"{V}: cu_seqlens_q must be contiguous"),
    (varlen(max_seqlen_q=-1), f"{V}: max_seqlen_q and max_seqlen_k must be >= 0, got -1 and 4"),
    (varlen(cu_seqlens_k=None), f"{V}: cu_seqlens_k is required without a block_table"),
    (varlen(cu_seqlens_k=_cu([2])), f"{V}: cu_seqlens_k must be 1-D with 3 elements, got shape [2]"),
    (varlen(softmax_scale=float("nan")), f"{V}: softmax_scale must be finite, got nan"),
    (
        varlen(softmax_scale=1e39),
        f"{V}: softmax_scale must fit in a 32-bit float (the vendored kernel's type), got 1e+39",
    ),
    (varlen(softcap=-0.5), f"{V}: softcap must be finite and >= 0, got -0.5"),
    (
        varlen(window_left=2**31),
        f"{V}: window_left must fit in a 32-bit int (the vendored kernel's type), got 2147483648",
    ),
    (varlen(num_splits=129), f"{V}: num_splits must be in [0, 128], got 129"),
    (varlen(v=None), f"{V}: v must be a tensor, got an undefined tensor (None)"),
    (paged_varlen(seqused_k=None), f"{V}: seqused_k is required with a block_table (keys per sequence)"),
    (
        paged_varlen(seqused_k=torch.tensor([2], dtype=I32)),
        f"{V}: seqused_k must be 1-D with 2 elements, got shape [1]",
    ),
    (
        paged_varlen(k=torch.randn(3, 0, 2, 64), v=torch.randn(3, 0, 2, 64)),
        f"{V}: k block size (dim 1 of the paged cache) must be positive, got 0",
    ),
    (
        paged_varlen(block_table=torch.zeros(3, 1, dtype=I32)),
        f"{V}: block_table must be [batch_size=2, max_blocks], got shape [3, 1]",
    ),
    (
        paged_varlen(block_table=torch.zeros(2, 4, dtype=I32)[:, ::2]),
        f"{V}: block_table must have a contiguous last dimension",
    ),
    (paged_varlen(k=torch.randn(6, 2, 64)), f"{V}: k must be 4-D, got shape [6, 2, 64]"),
    (kvcache(q=torch.randn(2, 4, 64)), f"{K}: q must be 4-D, got shape [2, 4, 64]"),
    (kvcache(v_cache=torch.randn(3, 4, 2, 64).half()), f"{K}: v_cache must have the dtype of q (float32), got float16"),
    (
        kvcache(v_cache=torch.randn(3, 8, 2, 64)),
        f"{K}: v_cache must have the shape of k_cache [3, 4, 2, 64], got [3, 8, 2, 64]",
    ),
    (
        kvcache(k_cache=torch.randn(3, 0, 2, 64), v_cache=torch.randn(3, 0, 2, 64)),
        f"{K}: k_cache block size (dim 1) must be positive, got 0",
    ),
    (
        kvcache(block_table=torch.zeros(2, dtype=I32)),
        f"{K}: block_table must be 2-D [batch_size, max_blocks], got shape [2]",
    ),
    (
        kvcache(block_table=None),
        f"{K}: k_cache must be [batch_size=2, seqlen_k, h_k, d] without a block_table, got [3, 4, 2, 64]",
    ),
    (
        kvcache(cache_seqlens=torch.tensor([3], dtype=I32)),
        f"{K}: cache_seqlens must be 1-D with 2 elements, got shape [1]",
    ),
    (
        kvcache(block_table=torch.zeros(1, 1, dtype=I32)),
        f"{K}: block_table must be [batch_size=2, max_blocks], got shape [1, 1]",
    ),
    (kvcache(softcap=float("inf")), f"{K}: softcap must be finite and >= 0, got inf"),
    (kvcache(num_splits=-1), f"{K}: num_splits must be in [0, 128], got -1"),
    (fp8_gemm(a=torch.randn(2, 256)), f"{D}::fp8_gemm_nt: a must be float8_e4m3fn, got float32"),
    (
        fp8_gemm(sfa=torch.ones(2, 2).double()),
        f"{D}::fp8_gemm_nt: sfa must be float8_e4m3fn, bfloat16 or float32, got float64",
    ),
    (fp8_gemm(b=torch.randn(130, 256, 1, 1, 1).to(FP8)), f"{D}::fp8_gemm_nt: b must have at most 4 dimensions, got 5"),
    (
        fp8_gemm(b=torch.randn(256, 130).to(FP8).T),
        f"{D}::fp8_gemm_nt: b must be K-major (unit stride along its last dim), got strides [1, 130]",
    ),
    (
        fp8_gemm(d=torch.empty(2, 130).half()),
        f"{D}::fp8_gemm_nt: d must be float8_e4m3fn, bfloat16 or float32, got float16",
    ),
    (fp8_gemm(d=torch.empty(2, 130).to(FP8)), f"{D}::fp8_gemm_nt: d must be bfloat16 or float32, got float8_e4m3fn"),
    (fp8_gemm(c=torch.empty(2, 130).to(FP8)), f"{D}::fp8_gemm_nt: c must be bfloat16 or float32, got float8_e4m3fn"),
    (fp8_gemm(c=torch.empty(2, 5)), f"{D}::fp8_gemm_nt: c must be [2, 130], got [2, 5]"),
    (fp8_gemm(sfb=torch.ones(2, 2).bfloat16()), f"{D}::fp8_gemm_nt: sfb must be float32, got bfloat16"),
    (fp8_gemm(sfa=torch.ones(2, 1)), f"{D}::fp8_gemm_nt: sfa must be [2, 2], got [2, 1]"),
    (fp8_gemm(recipe_m=1, recipe_n=1, recipe_k=128), f"{D}::fp8_gemm_nt: sfb must be [130, 2], got [2, 2]"),
    (
        fp8_gemm(recipe_m=2**40, recipe_n=2**40, recipe_k=2**40),
        f"{D}::fp8_gemm_nt: recipe_m must fit in a 32-bit int (the vendored kernel's type), got 1099511627776",
    ),
    (
        fp8_gemm(recipe_m=1, recipe_n=None, recipe_k=128),
        f"{D}::fp8_gemm_nt: recipe_m, recipe_n and recipe_k must be given together (upstream's recipe tuple)",
    ),
    (
        fp8_gemm(recipe_m=1, recipe_n=64, recipe_k=128),
        f"{D}::fp8_gemm_nt: recipe must be (1, 128, 128) (128x128-block B scales) or (1, 1, 128) (1x128 B scales), got (1, 64, 128)",
    ),
    (bf16_gemm(a=torch.randn(2, 8)), f"{D}::bf16_gemm_nt: a must be bfloat16, got float32"),
    (bf16_gemm(a=torch.randn(8).bfloat16()), f"{D}::bf16_gemm_nt: a must be 2-D [M, K], got [8]"),
    (bf16_gemm(b=torch.randn(3, 7).bfloat16()), f"{D}::bf16_gemm_nt: b must be [N, 8] (K of a), got [3, 7]"),
    (bf16_gemm(d=torch.empty(3, 2)), f"{D}::bf16_gemm_nt: d must be [2, 3], got [3, 2]"),
    (per_token(gran_k=0), f"{D}::per_token_cast_to_fp8: gran_k must be positive, got 0"),
    (
        per_token(gran_k=-(2**40)),
        f"{D}::per_token_cast_to_fp8: gran_k must fit in a 32-bit int (the vendored kernel's type), got -1099511627776",
    ),
    (
        per_token(x=torch.randn(3, 4, 5)),
        f"{D}::per_token_cast_to_fp8: x must be 2-D, got 3-D tensor of shape [3, 4, 5]",
    ),
    (
        per_token(x=torch.randn(3, 4).half()),
        f"{D}::per_token_cast_to_fp8: x must be float8_e4m3fn, bfloat16 or float32, got float16",
    ),
    (
        per_block(x=torch.randn(3, 4).to(FP8)),
        f"{D}::per_block_cast_to_fp8: x must be bfloat16 or float32, got float8_e4m3fn",
    ),
    (per_block(x=torch.randn(4)), f"{D}::per_block_cast_to_fp8: x must be 2-D, got 1-D tensor of shape [4]"),
]


@pytest.mark.parametrize("call,message", CASES, ids=[m.split(": ", 1)[1][:60] for _, m in CASES])
def test_fake_gives_the_kernels_error(call, message):
    op, kwargs = call
    assert _error(op, kwargs) == message  # the kernel (CPU tensors)
    assert _error(op, {k: _meta(v) for k, v in kwargs.items()}) == message  # the fake (meta tensors)


@pytest.mark.parametrize(
    "call", [varlen(), paged_varlen(), kvcache(), fp8_gemm(), bf16_gemm(), per_token(), per_block()]
)
def test_fake_accepts_what_the_kernel_accepts_with_its_output_shapes(call):
    op, kwargs = call
    out = op(**kwargs)
    fake = op(**{k: _meta(v) for k, v in kwargs.items()})
    shapes = [(o.shape, o.dtype) for o in (out if isinstance(out, tuple) else (out,)) if o is not None]
    assert shapes == [(o.shape, o.dtype) for o in (fake if isinstance(fake, tuple) else (fake,)) if o is not None]


def test_cpu_isa_fake_reports_the_process_build():
    assert FA.cpu_isa(torch.empty(0, device="meta")) == FA.cpu_isa(torch.empty(0))
