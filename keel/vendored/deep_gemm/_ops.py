"""Loads keel/vendored/deep_gemm/_C.abi3.so (namespace `keel_deep_gemm`) and registers each op's
fake implementation, so torch.compile / FakeTensor tracing knows output shapes without running kernels."""

from __future__ import annotations

import torch

from keel.vendored._loader import load_vendored

NAMESPACE = "keel_deep_gemm"
OPS = ["fp8_gemm_nt", "bf16_gemm_nt", "per_token_cast_to_fp8", "per_block_cast_to_fp8"]
LIBRARY = load_vendored("deep_gemm", NAMESPACE, OPS)


def _ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


# Writes d in place and returns nothing: the fake only has to accept the call.
@torch.library.register_fake(f"{NAMESPACE}::fp8_gemm_nt")
def _fp8_gemm_nt_fake(
    a, sfa, b, sfb, d, c=None, recipe_m=None, recipe_n=None, recipe_k=None, disable_ue8m0_cast=False
) -> None:
    return None


# Writes d in place and returns nothing.
@torch.library.register_fake(f"{NAMESPACE}::bf16_gemm_nt")
def _bf16_gemm_nt_fake(a, b, d, c=None) -> None:
    return None


# New e4m3 values of x's shape and fp32 scales, one per 1 x gran_k group.
@torch.library.register_fake(f"{NAMESPACE}::per_token_cast_to_fp8")
def _per_token_cast_fake(x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = 128):
    m, k = x.shape
    return x.new_empty((m, k), dtype=torch.float8_e4m3fn), x.new_empty((m, _ceil_div(k, gran_k)), dtype=torch.float32)


# New e4m3 values of x's shape and fp32 scales, one per 128 x 128 block.
@torch.library.register_fake(f"{NAMESPACE}::per_block_cast_to_fp8")
def _per_block_cast_fake(x: torch.Tensor, use_ue8m0: bool = False):
    n, k = x.shape
    return (
        x.new_empty((n, k), dtype=torch.float8_e4m3fn),
        x.new_empty((_ceil_div(n, 128), _ceil_div(k, 128)), dtype=torch.float32),
    )
