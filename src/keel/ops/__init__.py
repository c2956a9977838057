"""keel's own stable-ABI ops (`torch.ops.keel.*`), one typed wrapper per op.

Each area module also registers the op's fake (meta) implementation for torch.compile
and, where it makes sense, its autograd formula.
"""

from __future__ import annotations

from keel.ops.activation import silu_and_mul
from keel.ops.cache import reshape_and_cache
from keel.ops.elementwise import fused_muladd
from keel.ops.layer import layer_mlp, layer_qkv
from keel.ops.linear import fp8_linear, fp8_special_rows, linear
from keel.ops.norm import fused_add_rms_norm, rms_norm
from keel.ops.rotary import rotary_embedding

__all__ = [
    "fused_add_rms_norm",
    "fused_muladd",
    "fp8_linear",
    "fp8_special_rows",
    "layer_mlp",
    "layer_qkv",
    "linear",
    "reshape_and_cache",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
]
