"""keel_flash_attn's ops: loads the vendored attention library and registers its fake kernels.

Importing this module loads `keel/vendored/flash_attn/_C.abi3.so` (schemas in
adapters/flash_attn/bindings.cpp); `import keel` alone never does.
"""

from __future__ import annotations

import torch

from keel.vendored._loader import load_vendored

NAMESPACE = "keel_flash_attn"
OPS = ["varlen_fwd", "fwd_kvcache", "cpu_isa"]
LIBRARY = load_vendored("flash_attn", NAMESPACE, OPS)


# varlen mode: the output is packed like q, [total_q, H, D]
@torch.library.register_fake(f"{NAMESPACE}::varlen_fwd")
def _varlen_fwd_fake(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    seqused_k,
    block_table,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale,
    causal,
    window_left,
    window_right,
    softcap,
    num_splits,
):
    return q.new_empty(q.shape[0], q.shape[1], q.shape[2])


# batch mode: the output is [B, S_q, H, D] like q
@torch.library.register_fake(f"{NAMESPACE}::fwd_kvcache")
def _fwd_kvcache_fake(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    block_table,
    softmax_scale,
    causal,
    window_left,
    window_right,
    softcap,
    num_splits,
):
    return q.new_empty(q.shape[0], q.shape[1], q.shape[2], q.shape[3])


# the ISA is a property of the process, not of the tensor: any int
@torch.library.register_fake(f"{NAMESPACE}::cpu_isa")
def _cpu_isa_fake(probe):
    return 0
