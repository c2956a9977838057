"""Bad input to keel_flash_attn: errors naming the op and the argument, never a crash or garbage."""

from __future__ import annotations

import pytest
import torch
from support.flash_attn_ref import cu, paged

from keel.vendored.flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

VARLEN = "keel_flash_attn::varlen_fwd"
KVCACHE = "keel_flash_attn::fwd_kvcache"


def _varlen_args(**over):
    gen = torch.Generator().manual_seed(0)
    args = dict(
        q=torch.randn(6, 4, 64, generator=gen),
        k=torch.randn(6, 2, 64, generator=gen),
        v=torch.randn(6, 2, 64, generator=gen),
        cu_seqlens_q=cu([2, 4]),
        cu_seqlens_k=cu([2, 4]),
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
    args.update(over)
    return args


def _varlen(**over):
    return torch.ops.keel_flash_attn.varlen_fwd(**_varlen_args(**over))


def _decode_args(**over):
    gen = torch.Generator().manual_seed(0)
    pg = paged(torch.randn(40, 2, 64, generator=gen), torch.randn(40, 2, 64, generator=gen), [24, 16], 16, gen)
    args = dict(
        q=torch.randn(2, 1, 4, 64, generator=gen),
        k_cache=pg.k_cache,
        v_cache=pg.v_cache,
        cache_seqlens=pg.seqlens,
        block_table=pg.block_table,
        softmax_scale=0.125,
        causal=True,
        window_left=-1,
        window_right=-1,
        softcap=0.0,
        num_splits=0,
    )
    args.update(over)
    return args


def _decode(**over):
    return torch.ops.keel_flash_attn.fwd_kvcache(**_decode_args(**over))


@pytest.mark.parametrize(
    "over,pattern",
    [
        (dict(k=torch.randn(6, 2, 64).bfloat16()), r"k must have the dtype of q \(float32\), got bfloat16"),
        (dict(q=torch.randn(6, 4, 64).double()), r"q must be float32, bfloat16 or float16, got float64"),
        (dict(q=torch.randn(6, 4, 60)), r"head_size must be a positive multiple of 8"),
        (dict(q=torch.randn(6, 3, 64)), r"number of heads in q \(3\) must be a multiple of the kv heads \(2\)"),
        (dict(v=torch.randn(5, 2, 64)), r"v must have the shape of k \[6, 2, 64\], got \[5, 2, 64\]"),
        (dict(cu_seqlens_q=cu([2, 4]).long()), r"cu_seqlens_q must be int32, got int64"),
        (dict(cu_seqlens_q=cu([2, 3])), r"cu_seqlens_q\[-1\] must be total_q = 6, got 5"),
        (dict(max_seqlen_q=3), r"max_seqlen_q = 3 but sequence 1 has 4 queries"),
        (dict(cu_seqlens_k=None), r"cu_seqlens_k is required without a block_table"),
        (dict(window_left=2**40), r"window_left must fit in a 32-bit int .*got 1099511627776"),
        (dict(window_right=-(2**40)), r"window_right must fit in a 32-bit int"),
        (dict(max_seqlen_k=2**33), r"max_seqlen_k must fit in a 32-bit int"),
        (dict(softmax_scale=1e300), r"softmax_scale must fit in a 32-bit float"),
        (dict(softcap=-1.0), r"softcap must be finite and >= 0"),
        (dict(num_splits=1000), r"num_splits must be in \[0, 128\]"),
    ],
)
def test_varlen_bad_inputs_name_op_and_argument(over, pattern):
    with pytest.raises(RuntimeError, match=rf"{VARLEN}: {pattern}"):
        _varlen(**over)


@pytest.mark.parametrize(
    "over,pattern",
    [
        (
            dict(block_table=torch.zeros(3, 2, dtype=torch.int32)),
            r"block_table must be \[batch_size=2, max_blocks\], got shape \[3, 2\]",
        ),
        (dict(block_table=torch.zeros(2, 2, dtype=torch.int64)), r"block_table must be int32, got int64"),
        (
            dict(cache_seqlens=torch.tensor([24, 40], dtype=torch.int32)),
            r"cache_seqlens\[1\] = 40 must be in \[0, 32\]",
        ),
        (dict(cache_seqlens=torch.tensor([24], dtype=torch.int32)), r"cache_seqlens must be 1-D with 2 elements"),
        (dict(q=torch.randn(2, 4, 64)), r"q must be 4-D"),
        (
            dict(k_cache=torch.randn(5, 0, 2, 64), v_cache=torch.randn(5, 0, 2, 64)),
            r"k_cache block size \(dim 1\) must be positive, got 0",
        ),
        (dict(window_left=2**40), r"window_left must fit in a 32-bit int"),
    ],
)
def test_kvcache_bad_inputs_name_op_and_argument(over, pattern):
    with pytest.raises(RuntimeError, match=rf"{KVCACHE}: ({pattern})"):
        _decode(**over)


def test_block_table_entry_out_of_range_is_named():
    args = _decode_args()
    table = args["block_table"].clone()
    table[1, 0] = args["k_cache"].shape[0]  # one past the last block
    with pytest.raises(RuntimeError, match=rf"{KVCACHE}: block_table\[1\]\[0\] = {table[1, 0]} is outside the cache's"):
        _decode(block_table=table)
    table[1, 0] = -1
    with pytest.raises(RuntimeError, match=rf"{KVCACHE}: block_table\[1\]\[0\] = -1 is outside"):
        _decode(block_table=table)


def test_python_api_refuses_unsupported_options():
    a = _varlen_args()
    base = (a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_k"], 4, 4)
    with pytest.raises(NotImplementedError, match=r"flash_attn_varlen_func: dropout_p=0.1 is not supported"):
        flash_attn_varlen_func(*base, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match=r"alibi_slopes=True is not supported"):
        flash_attn_varlen_func(*base, alibi_slopes=torch.ones(4))
    with pytest.raises(NotImplementedError, match=r"return_attn_probs=True is not supported"):
        flash_attn_varlen_func(*base, return_attn_probs=True)
    with pytest.raises(ValueError, match=r"seqused_k is required with block_table"):
        flash_attn_varlen_func(*base, block_table=torch.zeros(2, 1, dtype=torch.int32))
    d = _decode_args()
    with pytest.raises(NotImplementedError, match=r"flash_attn_with_kvcache: k=True is not supported"):
        flash_attn_with_kvcache(d["q"], d["k_cache"], d["v_cache"], k=torch.ones(1), v=torch.ones(1))
