#!/usr/bin/env python
"""Benchmark keel.vendored.flash_attn against the peers it replaces, in the same run.

Records:
    docs/measurements/2026-12-01-attention.md
    docs/measurements/2026-12-03-row-ops.md

Decode (one query per sequence, bf16, paged cache with block size 16, shuffled block tables):
  vendored  flash_attn_with_kvcache straight from the block table
  gather    a paged cache read without paged kernels: index_select of
            the blocks into a dense tensor, SDPA with a dense -inf mask (mask built outside the
            timed region, as the engine builds it once per step)
  sdpa      SDPA on a contiguous [B, KV, L, D] cache (no paging, no mask): the dense lower bound
Prefill (causal, ragged batch): vendored flash_attn_varlen_func vs SDPA per sequence (a prefill loop
without varlen kernels); one 64-token prompt, and 7 one-token sequences beside it.

Methods alternate inside each repeat; the best repeat of each is reported, with ratios (> 1:
vendored faster). On a busy machine prefer --threads 1 (no waits on a descheduled pool thread).
Usage: python benchmarks/attention.py [--quick] [--repeats N] [--threads N]
       python benchmarks/attention.py --device cuda   (the GPU half: benchmarks/cuda_cases.py)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import cuda_cases as bench_cuda  # the --device cuda half (benchmarks/cuda_cases.py)
import torch
import torch.nn.functional as F
from keel_dev.timing import best_times

from keel.vendored.flash_attn import cpu_isa, flash_attn_varlen_func, flash_attn_with_kvcache


@dataclass(frozen=True)
class Shape:
    name: str
    heads: int
    kv_heads: int
    head_dim: int


SHAPES = [Shape("smollm2", 9, 3, 64), Shape("8b-like", 32, 8, 128)]
BLOCK = 16
DTYPE = torch.bfloat16
# ragged batches; [64]: one served prompt; [1] * 7 + [64]: a step's new prompt after 7 one-token rows (the
# sequences' lengths differ most, as in a served step that mixes decodes and a prompt)
PREFILL_LENS = [[128, 256, 64], [64], [1] * 7 + [64], [512, 1024]]


def decode_case(shape: Shape, batch: int, ctx: int, gen: torch.Generator) -> dict[str, Callable[[], object]]:
    h, kv, d = shape.heads, shape.kv_heads, shape.head_dim
    blocks_per_seq = ctx // BLOCK
    num_blocks = batch * blocks_per_seq + 4
    k_cache = torch.randn(num_blocks, BLOCK, kv, d, generator=gen).to(DTYPE)
    v_cache = torch.randn(num_blocks, BLOCK, kv, d, generator=gen).to(DTYPE)
    table = torch.randperm(num_blocks, generator=gen)[: batch * blocks_per_seq].view(batch, blocks_per_seq)
    table32 = table.to(torch.int32)
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    q = torch.randn(batch, 1, h, d, generator=gen).to(DTYPE)
    bias = torch.zeros(batch, 1, 1, ctx, dtype=DTYPE)  # every key visible (all sequences full)
    k_dense = k_cache.index_select(0, table.view(-1)).view(batch, -1, kv, d).transpose(1, 2).contiguous()
    v_dense = v_cache.index_select(0, table.view(-1)).view(batch, -1, kv, d).transpose(1, 2).contiguous()

    def vendored():
        return flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table32, causal=True)

    def gather():
        blocks = table.view(-1)
        k = k_cache.index_select(0, blocks).view(batch, -1, kv, d).transpose(1, 2)
        v = v_cache.index_select(0, blocks).view(batch, -1, kv, d).transpose(1, 2)
        qq = q.view(batch, kv, -1, d)
        return F.scaled_dot_product_attention(qq, k, v, attn_mask=bias)

    def sdpa():
        return F.scaled_dot_product_attention(q.view(batch, kv, -1, d), k_dense, v_dense)

    # the three agree (same math): a benchmark of wrong results is worthless
    ref = sdpa().reshape(batch, h, d).float()
    for fn in (vendored, gather):
        got = fn().reshape(batch, h, d).float()
        assert torch.allclose(got, ref, atol=2e-2, rtol=2e-2), (fn.__name__, (got - ref).abs().max())
    return {"vendored": vendored, "gather": gather, "sdpa": sdpa}


def prefill_case(shape: Shape, lens: list[int], gen: torch.Generator) -> dict[str, Callable[[], object]]:
    h, kv, d = shape.heads, shape.kv_heads, shape.head_dim
    total = sum(lens)
    q = torch.randn(total, h, d, generator=gen).to(DTYPE)
    k = torch.randn(total, kv, d, generator=gen).to(DTYPE)
    v = torch.randn(total, kv, d, generator=gen).to(DTYPE)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    bounds = cu.tolist()

    def vendored():
        return flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)

    def sdpa_loop():
        out = torch.empty_like(q)
        for s, e in zip(bounds[:-1], bounds[1:], strict=True):
            qs, ks, vs = (t[s:e].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            out[s:e] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)[0].transpose(0, 1)
        return out

    ref = sdpa_loop().float()
    got = vendored().float()
    assert torch.allclose(got, ref, atol=2e-2, rtol=2e-2), (got - ref).abs().max()
    return {"vendored": vendored, "sdpa_loop": sdpa_loop}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="contexts 256 and 1024 only, fewer repeats")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: vs SDPA's flash backend")
    bench_cuda.add_arguments(ap)
    args = ap.parse_args()
    if args.device == "cuda":
        bench_cuda.attention_main(args)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    repeats = 3 if args.quick else args.repeats
    contexts = [256, 1024] if args.quick else [256, 1024, 4096]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, vendored CPU build: {cpu_isa()}, "
        f"dtype {DTYPE}, block size {BLOCK}"
    )
    print("\n## decode (ms per call, best of the repeats; ratio = peer time / vendored time)")
    print("| shape | batch | context | vendored | gather+SDPA | SDPA contiguous | vs gather | vs SDPA |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for batch in (1, 8):
            for ctx in contexts:
                fns = decode_case(shape, batch, ctx, gen)
                inner = max(1, 64 // (batch * ctx // 256))
                t = best_times(fns, repeats=repeats, inner=inner)
                vend, gath, sdpa = t["vendored"], t["gather"], t["sdpa"]
                print(
                    f"| {shape.name} | {batch} | {ctx} | {vend * 1e3:.3f} | {gath * 1e3:.3f} | {sdpa * 1e3:.3f} | "
                    f"{gath / vend:.2f}x | {sdpa / vend:.2f}x |"
                )
    print("\n## prefill, causal, ragged batch (ms per call)")
    print("| shape | sequence lengths | vendored varlen | SDPA per sequence | ratio |")
    print("|---|---|---|---|---|")
    for shape in SHAPES:
        for lens in PREFILL_LENS if not args.quick else PREFILL_LENS[:3]:
            t = best_times(prefill_case(shape, lens, gen), repeats=repeats)
            print(
                f"| {shape.name} | {lens} | {t['vendored'] * 1e3:.2f} | {t['sdpa_loop'] * 1e3:.2f} | "
                f"{t['sdpa_loop'] / t['vendored']:.2f}x |"
            )


if __name__ == "__main__":
    main()
