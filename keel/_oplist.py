"""The ops of every torch.ops namespace keel's libraries register, in one place (torch-free).

The loader uses it to name the ops that get a "no CUDA kernel" error when a CUDA library is
missing; the fuzz harness (tests/fuzz, scripts/fuzz_ops.py) fuzzes every op listed here. A
vendored library adds its namespace with one line.
"""

from __future__ import annotations

KEEL_OPS: tuple[str, ...] = (
    "fused_muladd",
    "rms_norm",
    "fused_add_rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "reshape_and_cache",
    "linear",
)

NAMESPACES: dict[str, tuple[str, ...]] = {
    "keel": KEEL_OPS,
}
