"""Linear layer op: keel's own kernel on CPU for any row count (results independent of torch's oneDNN),
aten::linear on CUDA."""

from __future__ import annotations

import torch

from keel.ops import _checks as chk

_linear = torch.ops.keel.linear.default
_OP = "keel::linear"


def _check_bias(op: str, bias: torch.Tensor | None, x: torch.Tensor, n: int, weight_name: str) -> None:
    """The fakes' bias checks, as the kernels make them: [n], x's device and dtype."""
    if bias is not None:
        chk.same_device(op, "bias", bias, "x", x)
        chk.same_dtype(op, "bias", bias, "x", x)
        chk.check(
            bias.dim() == 1 and bias.shape[0] == n,
            f"{op}: bias must be [{n}] to match {weight_name}'s rows, got {chk.shape(bias)}",
        )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias for x [..., K], weight [N, K] (unit K stride), bias [N]; new contiguous [..., N]."""
    return _linear(x, weight, bias)


# Output shape for torch.compile / FakeTensor tracing, with the kernel's checks.
@torch.library.register_fake("keel::linear")
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    chk.float_dtype(_OP, "x", x)
    chk.min_dim(_OP, "x", x, 1)
    chk.same_device(_OP, "weight", weight, "x", x)
    chk.same_dtype(_OP, "weight", weight, "x", x)
    k = x.shape[-1]
    chk.check(
        weight.dim() == 2 and weight.shape[1] == k,
        f"{_OP}: weight must be [N, {k}] to match x's last dim, got {chk.shape(weight)}",
    )
    chk.check(
        weight.stride(1) == 1 or k <= 1,
        f"{_OP}: weight must have unit stride along its last dim (K), got stride {weight.stride(1)}",
    )
    _check_bias(_OP, bias, x, weight.shape[0], "weight")
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


_fp8_linear = torch.ops.keel.fp8_linear.default
_FP8_OP = "keel::fp8_linear"
FP8_BLOCK_K = 128  # K width of one weight scale


_fp8_special_rows = torch.ops.keel.fp8_special_rows.default
_SPECIAL_OP = "keel::fp8_special_rows"


def fp8_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    special_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ dequant(qweight).T + bias on the CPU, x [..., K] not quantized (weight-only FP8): qweight [N, K]
    float8_e4m3fn (unit K stride), scale fp32 per 128-wide K block, [N, ceil(K/128)] (one per row) or
    [ceil(N/128), ceil(K/128)] (one per 128 rows), bias [N] in x's dtype; new contiguous [..., N] in x's dtype.

    special_rows: `fp8_special_rows(qweight)`, computed once when the weight is loaded (the kernel trusts it:
    it must describe this qweight's current bytes). With it a one-row call skips its scan of the weight for
    bytes its fast decode cannot take; the result is the same, bit for bit."""
    return _fp8_linear(x, qweight, scale, bias, special_rows)


def fp8_special_rows(qweight: torch.Tensor) -> torch.Tensor:
    """bool [N]: whether row n of an e4m3 qweight [N, K] (CPU) holds a subnormal or NaN byte, the bytes
    `fp8_linear`'s fast decode cannot take (its exact path does). For `fp8_linear(..., special_rows=)`."""
    return _fp8_special_rows(qweight)


@torch.library.register_fake("keel::fp8_special_rows")
def _(qweight: torch.Tensor) -> torch.Tensor:
    chk.check(
        qweight.dtype == torch.float8_e4m3fn,
        f"{_SPECIAL_OP}: qweight must be float8_e4m3fn, got {chk.dtype_name(qweight.dtype)}",
    )
    chk.check(qweight.dim() == 2, f"{_SPECIAL_OP}: qweight must be [N, K], got {chk.shape(qweight)}")
    return qweight.new_empty((qweight.shape[0],), dtype=torch.bool)


@torch.library.register_fake("keel::fp8_linear")
def _(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    special_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    chk.float_dtype(_FP8_OP, "x", x)
    chk.min_dim(_FP8_OP, "x", x, 1)
    chk.same_device(_FP8_OP, "qweight", qweight, "x", x)
    chk.same_device(_FP8_OP, "scale", scale, "x", x)
    chk.check(
        qweight.dtype == torch.float8_e4m3fn,
        f"{_FP8_OP}: qweight must be float8_e4m3fn, got {chk.dtype_name(qweight.dtype)}",
    )
    chk.check(
        scale.dtype == torch.float32,
        f"{_FP8_OP}: scale must be float32, got {chk.dtype_name(scale.dtype)}",
    )
    k = x.shape[-1]
    chk.check(
        qweight.dim() == 2 and qweight.shape[1] == k,
        f"{_FP8_OP}: qweight must be [N, {k}] to match x's last dim, got {chk.shape(qweight)}",
    )
    chk.check(
        qweight.stride(1) == 1 or k <= 1,
        f"{_FP8_OP}: qweight must have unit stride along its last dim (K), got stride {qweight.stride(1)}",
    )
    n = qweight.shape[0]
    kb, nb = -(-k // FP8_BLOCK_K), -(-n // 128)
    chk.check(
        scale.dim() == 2 and scale.shape[1] == kb and scale.shape[0] in (n, nb),
        f"{_FP8_OP}: scale must be [{n}, {kb}] (per row) or [{nb}, {kb}] (per 128 rows) for qweight "
        f"{chk.shape(qweight)}, got {chk.shape(scale)}",
    )
    _check_bias(_FP8_OP, bias, x, n, "qweight")
    if special_rows is not None:
        chk.same_device(_FP8_OP, "special_rows", special_rows, "qweight", qweight)
        chk.check(
            special_rows.dtype == torch.bool,
            f"{_FP8_OP}: special_rows must be bool, got {chk.dtype_name(special_rows.dtype)}",
        )
        chk.check(
            special_rows.dim() == 1 and special_rows.shape[0] == n,
            f"{_FP8_OP}: special_rows must be [{n}] (one per qweight row: fp8_special_rows(qweight)), "
            f"got {chk.shape(special_rows)}",
        )
    return x.new_empty((*x.shape[:-1], n))
