"""A decoder layer's step in two ops around its attention: layer_qkv (input norm, qkv projection, q/k norms, rotary,
cache write) and layer_mlp (o projection, residual add and norm, gate/up projection, SiLU, down projection).

A projection is given as `Projection`: the weights the op takes (`(weight, scale, bias, special_rows)`: keel::linear's
weight in the activations' dtype, or keel::fp8_linear's float8_e4m3fn weight with its scales), or any callable
`x -> x @ W^T + b` (oneDNN's prepacked linear, CUDA's FP8 GEMM, a module under test). With callables the step is
composed of keel's separate ops in the same order: the ops' definition, whose bits the fused kernels reproduce
(tests/ops/test_layer_ops.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from keel.ops import _checks as chk
from keel.ops.activation import silu_and_mul
from keel.ops.cache import reshape_and_cache
from keel.ops.norm import fused_add_rms_norm, rms_norm
from keel.ops.rotary import rotary_embedding

Weights = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]
Projection = Weights | Callable[[torch.Tensor], torch.Tensor]

_layer_qkv = torch.ops.keel.layer_qkv.default
_layer_mlp = torch.ops.keel.layer_mlp.default
_QKV = "keel::layer_qkv"
_MLP = "keel::layer_mlp"
_MAX_HEADS = 65536  # as the kernel bounds them


def layer_qkv(
    x: torch.Tensor | None,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    qkv: Projection,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """A layer up to its attention for residual [T, hidden]: residual += x (when given); h = rms_norm(residual);
    q, k, v = h @ qkv^T; q and k rms-normed per head (when the weights are given) and rotated (NeoX) by
    cos_sin_cache[positions]; k, v written to the paged caches at slot_mapping. Returns q [T, num_heads, head_size]."""
    if callable(qkv):
        return _qkv_composed(x, residual, norm_weight, eps, qkv, q_norm_weight, k_norm_weight, positions,
                             cos_sin_cache, num_heads, num_kv_heads, key_cache, value_cache, slot_mapping)  # fmt: skip
    return _layer_qkv(x, residual, norm_weight, eps, *qkv, q_norm_weight, k_norm_weight, positions, cos_sin_cache,
                      num_heads, num_kv_heads, key_cache, value_cache, slot_mapping)  # fmt: skip


def layer_mlp(
    attn: torch.Tensor,
    residual: torch.Tensor,
    o: Projection,
    norm_weight: torch.Tensor,
    eps: float,
    gate_up: Projection,
    down: Projection,
) -> torch.Tensor:
    """A layer after its attention for attn [T, K]: residual += attn @ o^T; h = rms_norm(residual); returns
    (silu(gate) * up of h @ gate_up^T) @ down^T [T, hidden]."""
    if callable(o) or callable(gate_up) or callable(down):
        return _mlp_composed(attn, residual, o, norm_weight, eps, gate_up, down)
    return _layer_mlp(attn, residual, *o, norm_weight, eps, *gate_up, *down)


def project(x: torch.Tensor, p: Projection) -> torch.Tensor:
    """x @ p^T (+ bias) through keel's linear or fp8_linear op, or p itself when it is a callable."""
    if callable(p):
        return p(x)
    weight, scale, bias, special = p
    if weight.dtype == torch.float8_e4m3fn:
        return torch.ops.keel.fp8_linear.default(x, weight, scale, bias, special)
    return torch.ops.keel.linear.default(x, weight, bias)


def _qkv_composed(x, residual, norm_weight, eps, qkv, q_norm_weight, k_norm_weight, positions, cos_sin_cache,
                  num_heads, num_kv_heads, key_cache, value_cache, slot_mapping) -> torch.Tensor:  # fmt: skip
    """layer_qkv as keel's separate ops, in the fused op's order."""
    if x is None:
        h = rms_norm(residual, norm_weight, eps)
    else:
        h = x.clone()  # the op leaves x as it is
        fused_add_rms_norm(h, residual, norm_weight, eps)
    t, d = residual.shape[0], key_cache.shape[3]
    q, k, v = project(h, qkv).view(t, -1, d).split_with_sizes([num_heads, num_kv_heads, num_kv_heads], 1)
    if q_norm_weight is not None:
        q, k = rms_norm(q, q_norm_weight, eps), rms_norm(k, k_norm_weight, eps)
    q = q.contiguous()
    rotary_embedding(positions, q, k, d, cos_sin_cache, True)
    reshape_and_cache(k, v, key_cache, value_cache, slot_mapping)
    return q


def _mlp_composed(attn, residual, o, norm_weight, eps, gate_up, down) -> torch.Tensor:  # fmt: skip
    """layer_mlp as keel's separate ops, in the fused op's order."""
    h = project(attn, o)
    fused_add_rms_norm(h, residual, norm_weight, eps)
    return project(silu_and_mul(project(h, gate_up)), down)


# ---- fakes: output shapes for torch.compile / FakeTensor tracing, with the kernels' checks in their order ----------


def _projection(op: str, name: str, p: tuple, ref: torch.Tensor, k: int, n: int, n_what: str) -> int:
    """csrc/ops/projection.cpp check_projection; returns the output features."""
    weight, scale, bias, special = p
    w = f"{name}_weight"
    chk.same_device(op, w, weight, "residual", ref)
    fp8 = weight.dtype == torch.float8_e4m3fn
    chk.check(
        fp8 or weight.dtype == ref.dtype,
        f"{op}: {w} must be float8_e4m3fn or have the dtype of residual ({chk.dtype_name(ref.dtype)}), "
        f"got {chk.dtype_name(weight.dtype)}",
    )
    if n >= 0:
        ok = weight.dim() == 2 and weight.shape[0] == n and weight.shape[1] == k
        chk.check(ok, f"{op}: {w} must be [{n}, {k}] ({n_what}), got {chk.shape(weight)}")
    else:
        ok = weight.dim() == 2 and weight.shape[1] == k
        chk.check(ok, f"{op}: {w} must be [N, {k}] ({n_what}), got {chk.shape(weight)}")
    chk.check(
        weight.stride(1) == 1 or k <= 1,
        f"{op}: {w} must have unit stride along its last dim (K), got stride {weight.stride(1)}",
    )
    rows = weight.shape[0]
    kind = chk.dtype_name(weight.dtype)
    if fp8:
        _fp8_scale(op, name, scale, ref, k, rows, weight)
        if special is not None:
            _rows_vector(op, f"{name}_special_rows", special, ref, rows, w, torch.bool)
    else:
        chk.check(scale is None, f"{op}: {name}_scale is only for a float8_e4m3fn {w}, got a {kind} {w}")
        chk.check(special is None, f"{op}: {name}_special_rows is only for a float8_e4m3fn {w}, got a {kind} {w}")
    if bias is not None:
        _rows_vector(op, f"{name}_bias", bias, ref, rows, w, None)
    return rows


def _fp8_scale(op: str, name: str, scale, ref: torch.Tensor, k: int, n: int, weight: torch.Tensor) -> None:
    s, w = f"{name}_scale", f"{name}_weight"
    chk.check(scale is not None, f"{op}: {s} must be given for a float8_e4m3fn {w} (fp32 scales per 128-wide K block)")
    chk.same_device(op, s, scale, "residual", ref)
    chk.check(scale.dtype == torch.float32, f"{op}: {s} must be float32, got {chk.dtype_name(scale.dtype)}")
    kb, nb = -(-k // 128), -(-n // 128)
    chk.check(
        scale.dim() == 2 and scale.shape[1] == kb and scale.shape[0] in (n, nb),
        f"{op}: {s} must be [{n}, {kb}] (per row) or [{nb}, {kb}] (per 128 rows) for {w} {chk.shape(weight)}, "
        f"got {chk.shape(scale)}",
    )


def _rows_vector(op: str, arg: str, t, ref: torch.Tensor, n: int, w: str, dtype: torch.dtype | None) -> None:
    chk.same_device(op, arg, t, "residual", ref)
    if dtype is torch.bool:
        chk.check(t.dtype == torch.bool, f"{op}: {arg} must be bool, got {chk.dtype_name(t.dtype)}")
    else:
        chk.same_dtype(op, arg, t, "residual", ref)
    chk.check(t.dim() == 1 and t.shape[0] == n, f"{op}: {arg} must be [{n}] to match {w}'s rows, got {chk.shape(t)}")


def _norm_vector(op: str, arg: str, w, ref: torch.Tensor, size: int, what: str) -> None:
    chk.same_device(op, arg, w, "residual", ref)
    chk.same_dtype(op, arg, w, "residual", ref)
    chk.check(
        w.dim() == 1 and w.shape[0] == size,
        f"{op}: {arg} must be 1-D with {size} elements ({what}), got shape {chk.shape(w)}",
    )


def _index(arg: str, t, ref: torch.Tensor, tokens: int) -> None:
    chk.same_device(_QKV, arg, t, "residual", ref)
    chk.check(t.dtype == torch.int64, f"{_QKV}: {arg} must be int64, got {chk.dtype_name(t.dtype)}")
    chk.check(
        t.dim() == 1 and t.shape[0] == tokens,
        f"{_QKV}: {arg} must be 1-D with one entry per token ({tokens}), got shape {chk.shape(t)}",
    )


def _residual(op: str, residual) -> None:
    chk.float_dtype(op, "residual", residual)
    chk.dim(op, "residual", residual, 2)


def _qkv_caches(residual, eps: float, num_heads: int, num_kv_heads: int, key_cache, value_cache) -> None:
    chk.check(eps >= 0.0, f"{_QKV}: eps must be a non-negative number, got {chk.cpp_number(eps)}")
    chk.check(
        0 < num_heads <= _MAX_HEADS and 0 < num_kv_heads <= _MAX_HEADS,
        f"{_QKV}: num_heads and num_kv_heads must be in [1, {_MAX_HEADS}], got {num_heads} and {num_kv_heads}",
    )
    for arg, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        chk.same_device(_QKV, arg, c, "residual", residual)
        chk.same_dtype(_QKV, arg, c, "residual", residual)
        if arg == "key_cache":
            chk.dim(_QKV, arg, c, 4)
    chk.same_shape(_QKV, "value_cache", value_cache, "key_cache", key_cache)
    chk.check(
        key_cache.shape[1] > 0 and key_cache.shape[2] == num_kv_heads and key_cache.shape[3] > 0,
        f"{_QKV}: key_cache must be [num_blocks, block_size > 0, num_kv_heads={num_kv_heads}, head_size > 0], "
        f"got {chk.shape(key_cache)}",
    )


def _rope(cos_sin_cache, residual, d: int) -> None:
    chk.same_device(_QKV, "cos_sin_cache", cos_sin_cache, "residual", residual)
    chk.dim(_QKV, "cos_sin_cache", cos_sin_cache, 2)
    rot = cos_sin_cache.shape[1]
    chk.check(
        rot > 0 and rot % 2 == 0 and rot <= d,
        f"{_QKV}: cos_sin_cache must be [max_position, rot_dim] with an even rot_dim <= head_size={d}, "
        f"got shape {chk.shape(cos_sin_cache)}",
    )
    chk.check(
        cos_sin_cache.dtype in (torch.float32, residual.dtype),
        f"{_QKV}: cos_sin_cache must be float32 or the dtype of residual ({chk.dtype_name(residual.dtype)}), "
        f"got {chk.dtype_name(cos_sin_cache.dtype)}",
    )


@torch.library.register_fake("keel::layer_qkv")
def _(x, residual, norm_weight, eps, qkv_weight, qkv_scale, qkv_bias, qkv_special_rows, q_norm_weight, k_norm_weight,
      positions, cos_sin_cache, num_heads, num_kv_heads, key_cache, value_cache, slot_mapping):  # fmt: skip
    _residual(_QKV, residual)
    t, hidden = residual.shape
    if x is not None:
        chk.same_device(_QKV, "x", x, "residual", residual)
        chk.same_dtype(_QKV, "x", x, "residual", residual)
        chk.same_shape(_QKV, "x", x, "residual", residual)
    _norm_vector(_QKV, "norm_weight", norm_weight, residual, hidden, "the last dim of residual")
    _qkv_caches(residual, eps, num_heads, num_kv_heads, key_cache, value_cache)
    d = key_cache.shape[3]
    qkv = (qkv_weight, qkv_scale, qkv_bias, qkv_special_rows)
    _projection(_QKV, "qkv", qkv, residual, hidden, (num_heads + 2 * num_kv_heads) * d,
                "rows: (num_heads + 2 * num_kv_heads) * head_size")  # fmt: skip
    chk.check(
        (q_norm_weight is None) == (k_norm_weight is None),
        f"{_QKV}: q_norm_weight and k_norm_weight must be given together (or neither)",
    )
    if q_norm_weight is not None:
        _norm_vector(_QKV, "q_norm_weight", q_norm_weight, residual, d, "head_size")
        _norm_vector(_QKV, "k_norm_weight", k_norm_weight, residual, d, "head_size")
    _index("positions", positions, residual, t)
    _rope(cos_sin_cache, residual, d)
    _index("slot_mapping", slot_mapping, residual, t)
    if x is not None:
        chk.not_same(_QKV, "residual", residual, "x", x)
    chk.not_same(_QKV, "residual", residual, "norm_weight", norm_weight)
    chk.not_same(_QKV, "key_cache", key_cache, "value_cache", value_cache)
    chk.not_same(_QKV, "key_cache", key_cache, "residual", residual)
    chk.not_same(_QKV, "value_cache", value_cache, "residual", residual)
    return residual.new_empty((t, num_heads, d))


@torch.library.register_fake("keel::layer_mlp")
def _(attn, residual, o_weight, o_scale, o_bias, o_special_rows, norm_weight, eps, gate_up_weight, gate_up_scale,
      gate_up_bias, gate_up_special_rows, down_weight, down_scale, down_bias, down_special_rows):  # fmt: skip
    _residual(_MLP, residual)
    t, hidden = residual.shape
    chk.same_device(_MLP, "attn", attn, "residual", residual)
    chk.same_dtype(_MLP, "attn", attn, "residual", residual)
    chk.check(
        attn.dim() == 2 and attn.shape[0] == t,
        f"{_MLP}: attn must be [{t}, K] (a row per row of residual), got shape {chk.shape(attn)}",
    )
    _norm_vector(_MLP, "norm_weight", norm_weight, residual, hidden, "the last dim of residual")
    chk.check(eps >= 0.0, f"{_MLP}: eps must be a non-negative number, got {chk.cpp_number(eps)}")
    rows = "rows: the last dim of residual"
    _projection(_MLP, "o", (o_weight, o_scale, o_bias, o_special_rows), residual, attn.shape[1], hidden, rows)
    gate_up = (gate_up_weight, gate_up_scale, gate_up_bias, gate_up_special_rows)
    n = _projection(_MLP, "gate_up", gate_up, residual, hidden, -1, "gate and up halves")
    chk.check(
        n % 2 == 0,
        f"{_MLP}: gate_up_weight must have an even number of rows (gate and up halves), "
        f"got {chk.shape(gate_up_weight)}",
    )
    _projection(_MLP, "down", (down_weight, down_scale, down_bias, down_special_rows), residual, n // 2, hidden, rows)
    chk.not_same(_MLP, "residual", residual, "attn", attn)
    chk.not_same(_MLP, "residual", residual, "norm_weight", norm_weight)
    return residual.new_empty((t, hidden))
