"""ggml tensor types, their block layouts, and numpy dequantization to float32."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np


class GGMLType(IntEnum):
    """ggml tensor type ids (ggml.h); only some of them can be dequantized here."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """``block_size`` elements are stored in ``type_size`` bytes."""

    block_size: int
    type_size: int


# layouts of every type keel can size (for bounds checks) -- ggml.c type_traits
LAYOUTS: dict[GGMLType, BlockLayout] = {
    GGMLType.F32: BlockLayout(1, 4),
    GGMLType.F16: BlockLayout(1, 2),
    GGMLType.BF16: BlockLayout(1, 2),
    GGMLType.F64: BlockLayout(1, 8),
    GGMLType.I8: BlockLayout(1, 1),
    GGMLType.I16: BlockLayout(1, 2),
    GGMLType.I32: BlockLayout(1, 4),
    GGMLType.I64: BlockLayout(1, 8),
    GGMLType.Q4_0: BlockLayout(32, 2 + 16),
    GGMLType.Q4_1: BlockLayout(32, 2 + 2 + 16),
    GGMLType.Q5_0: BlockLayout(32, 2 + 4 + 16),
    GGMLType.Q5_1: BlockLayout(32, 2 + 2 + 4 + 16),
    GGMLType.Q8_0: BlockLayout(32, 2 + 32),
    GGMLType.Q8_1: BlockLayout(32, 4 + 4 + 32),
    GGMLType.Q2_K: BlockLayout(256, 2 + 2 + 16 + 64),
    GGMLType.Q3_K: BlockLayout(256, 2 + 12 + 64 + 32),
    GGMLType.Q4_K: BlockLayout(256, 2 + 2 + 12 + 128),
    GGMLType.Q5_K: BlockLayout(256, 2 + 2 + 12 + 32 + 128),
    GGMLType.Q6_K: BlockLayout(256, 2 + 16 + 128 + 64),
    GGMLType.Q8_K: BlockLayout(256, 4 + 256 + 32),
}


def tensor_nbytes(ggml_type: GGMLType, dims: tuple[int, ...]) -> int:
    """Bytes a tensor of ``dims`` (GGUF order) takes; ValueError if the type or shape does not fit."""
    layout = LAYOUTS.get(ggml_type)
    if layout is None:
        raise ValueError(f"ggml type {ggml_type.name} is not supported (supported: {supported_names()})")
    if any(d <= 0 for d in dims):
        raise ValueError(f"dims {dims} must all be positive")
    if dims[0] % layout.block_size:
        raise ValueError(
            f"first dim {dims[0]} is not a multiple of the {ggml_type.name} block size {layout.block_size}"
        )
    n = 1
    for d in dims:
        n *= d
    return n // layout.block_size * layout.type_size


def supported_names() -> str:
    return ", ".join(t.name for t in LAYOUTS)


def _blocks(raw: np.ndarray, layout: BlockLayout) -> np.ndarray:
    return raw.reshape(-1, layout.type_size)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """A float16 field at byte ``start`` of every block, as float32 column [n_blocks, 1]."""
    return blocks[:, start : start + 2].copy().view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 packed bytes -> 32 values: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """4 bytes of high bits -> bit j of the little-endian uint32 for element j, shifted to bit 4."""
    bits = qh.copy().view("<u4")  # [n, 1]
    return (((bits >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def _q4_0(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, LAYOUTS[GGMLType.Q4_0])
    return _f16(b, 0) * (_nibbles(b[:, 2:]) - 8.0)


def _q4_1(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, LAYOUTS[GGMLType.Q4_1])
    return _f16(b, 0) * _nibbles(b[:, 4:]) + _f16(b, 2)


def _q5_0(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, LAYOUTS[GGMLType.Q5_0])
    q = _nibbles(b[:, 6:]).astype(np.uint8) | _fifth_bits(b[:, 2:6])
    return _f16(b, 0) * (q.astype(np.float32) - 16.0)


def _q5_1(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, LAYOUTS[GGMLType.Q5_1])
    q = _nibbles(b[:, 8:]).astype(np.uint8) | _fifth_bits(b[:, 4:8])
    return _f16(b, 0) * q.astype(np.float32) + _f16(b, 2)


def _q8_0(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, LAYOUTS[GGMLType.Q8_0])
    return _f16(b, 0) * b[:, 2:].view(np.int8).astype(np.float32)


def _bf16(raw: np.ndarray) -> np.ndarray:
    return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)


_DEQUANT = {
    GGMLType.F32: lambda raw: raw.view("<f4").copy(),
    GGMLType.F16: lambda raw: raw.view("<f2").astype(np.float32),
    GGMLType.BF16: _bf16,
    GGMLType.Q4_0: _q4_0,
    GGMLType.Q4_1: _q4_1,
    GGMLType.Q5_0: _q5_0,
    GGMLType.Q5_1: _q5_1,
    GGMLType.Q8_0: _q8_0,
}

DEQUANTIZABLE = tuple(_DEQUANT)


def dequantize(raw: np.ndarray, ggml_type: GGMLType, shape: tuple[int, ...]) -> np.ndarray:
    """Float32 values of a tensor stored as ``ggml_type`` bytes ``raw``, reshaped to torch ``shape``."""
    fn = _DEQUANT.get(ggml_type)
    if fn is None:
        names = ", ".join(t.name for t in DEQUANTIZABLE)
        raise ValueError(f"cannot dequantize ggml type {ggml_type.name}; supported: {names}")
    expected = tensor_nbytes(ggml_type, tuple(reversed(shape)))
    if raw.size != expected:
        raise ValueError(f"{ggml_type.name} tensor of shape {shape} needs {expected} bytes, got {raw.size}")
    out = fn(np.ascontiguousarray(raw, dtype=np.uint8))
    return np.asarray(out, dtype=np.float32).reshape(shape)
