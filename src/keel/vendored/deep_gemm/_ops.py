"""Loads keel/vendored/deep_gemm/_C.abi3.so (namespace `keel_deep_gemm`) and registers each op's fake.

The fakes (meta tensors, torch.compile / FakeTensor tracing) run the checks of the adapter
(adapters/deep_gemm/deep_gemm.cpp) and of the fork (vendored_deps/deep_gemm/csrc/apis/) in the
same order and with the same messages, so a bad call fails on meta as it fails on CPU.
"""

from __future__ import annotations

import torch

from keel import _oplist
from keel.vendored import _checks as vc
from keel.vendored._loader import load_vendored

NAMESPACE = "keel_deep_gemm"
OPS = list(_oplist.ops(NAMESPACE))
LIBRARY = load_vendored("deep_gemm", NAMESPACE, OPS)

_FORK_NAMES = {torch.float8_e4m3fn: "float8_e4m3fn", torch.bfloat16: "bfloat16", torch.float32: "float32"}


def _ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def _fork_dtype(t: torch.Tensor) -> str:
    """The fork's DType name (csrc/utils/tensor_view.hpp dtype_name)."""
    return _FORK_NAMES.get(t.dtype, "an unsupported dtype")


def _view(op: str, arg: str, t: object, ref: torch.Tensor | None) -> torch.Tensor:
    """The adapter's view(): device, at most 4 dims, a dtype the fork knows."""
    t = vc.library_device(op, arg, t, ref)
    if t.dim() > 4:
        vc.fail(f"{op}: {arg} must have at most 4 dimensions, got {t.dim()}")
    if t.dtype not in _FORK_NAMES:
        vc.fail(f"{op}: {arg} must be float8_e4m3fn, bfloat16 or float32, got {vc.stable_dtype_name(t.dtype)}")
    return t


def _dtype(op: str, arg: str, t: torch.Tensor, want: torch.dtype) -> None:
    if t.dtype != want:
        vc.fail(f"{op}: {arg} must be {_FORK_NAMES[want]}, got {_fork_dtype(t)}")


def _out_dtype(op: str, arg: str, t: torch.Tensor) -> None:
    if t.dtype not in (torch.bfloat16, torch.float32):
        vc.fail(f"{op}: {arg} must be bfloat16 or float32, got {_fork_dtype(t)}")


def _two_d(op: str, arg: str, t: torch.Tensor, rows: int, cols: int) -> None:
    if not (t.dim() == 2 and t.shape[0] == rows and t.shape[1] == cols):
        vc.fail(f"{op}: {arg} must be [{rows}, {cols}], got {vc.shape(t)}")


def _size(t: torch.Tensor, i: int) -> int:
    """TensorView::sizes[i]: 0 past the tensor's rank."""
    return int(t.shape[i]) if i < t.dim() else 0


def _operands(op: str, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None) -> None:
    """check_operands (gemm.cpp): a [M, K], b [N, K], K-major, d and c [M, N]."""
    if a.dim() != 2:
        vc.fail(f"{op}: a must be 2-D [M, K], got {vc.shape(a)}")
    if not (b.dim() == 2 and b.shape[1] == a.shape[1]):
        vc.fail(f"{op}: b must be [N, {a.shape[1]}] (K of a), got {vc.shape(b)}")
    for arg, t in (("a", a), ("b", b)):
        if not (t.stride(1) == 1 or t.shape[1] <= 1):
            vc.fail(
                f"{op}: {arg} must be K-major (unit stride along its last dim), "
                f"got strides [{t.stride(0)}, {t.stride(1)}]"
            )
    m, n = a.shape[0], b.shape[0]
    _two_d(op, "d", d, m, n)
    _out_dtype(op, "d", d)
    if c is not None:
        _two_d(op, "c", c, m, n)
        _out_dtype(op, "c", c)


# Writes d in place and returns nothing: the fake checks the call as the kernel does.
@torch.library.register_fake(f"{NAMESPACE}::fp8_gemm_nt")
def _fp8_gemm_nt_fake(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    d: torch.Tensor,
    c: torch.Tensor | None = None,
    recipe_m: int | None = None,
    recipe_n: int | None = None,
    recipe_k: int | None = None,
    disable_ue8m0_cast: bool = False,
) -> None:
    op = f"{NAMESPACE}::fp8_gemm_nt"
    recipe: tuple[int, int, int] | None = None
    if recipe_m is not None or recipe_n is not None or recipe_k is not None:
        if recipe_m is None or recipe_n is None or recipe_k is None:
            vc.fail(f"{op}: recipe_m, recipe_n and recipe_k must be given together (upstream's recipe tuple)")
        assert recipe_m is not None and recipe_n is not None and recipe_k is not None
        recipe = (
            vc.to_int(op, "recipe_m", recipe_m),
            vc.to_int(op, "recipe_n", recipe_n),
            vc.to_int(op, "recipe_k", recipe_k),
        )
    ref = a if isinstance(a, torch.Tensor) else None
    a, sfa, b, sfb, d = (
        _view(op, "a", a, ref),
        _view(op, "sfa", sfa, ref),
        _view(op, "b", b, ref),
        _view(op, "sfb", sfb, ref),
        _view(op, "d", d, ref),
    )
    if c is not None:
        c = _view(op, "c", c, ref)
    gran_n = 128
    if recipe is not None:
        rm, rn, rk = recipe
        if not (rm == 1 and rn in (128, 1) and rk == 128):
            vc.fail(
                f"{op}: recipe must be (1, 128, 128) (128x128-block B scales) or (1, 1, 128) (1x128 B scales), "
                f"got ({rm}, {rn}, {rk})"
            )
        gran_n = rn
    _dtype(op, "a", a, torch.float8_e4m3fn)
    _dtype(op, "b", b, torch.float8_e4m3fn)
    _operands(op, a, b, d, c)
    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    _dtype(op, "sfa", sfa, torch.float32)
    _dtype(op, "sfb", sfb, torch.float32)
    _two_d(op, "sfa", sfa, m, _ceil_div(k, 128))
    _two_d(op, "sfb", sfb, _ceil_div(n, gran_n), _ceil_div(k, 128))


# Writes d in place and returns nothing.
@torch.library.register_fake(f"{NAMESPACE}::bf16_gemm_nt")
def _bf16_gemm_nt_fake(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    op = f"{NAMESPACE}::bf16_gemm_nt"
    ref = a if isinstance(a, torch.Tensor) else None
    a, b, d = _view(op, "a", a, ref), _view(op, "b", b, ref), _view(op, "d", d, ref)
    if c is not None:
        c = _view(op, "c", c, ref)
    _dtype(op, "a", a, torch.bfloat16)
    _dtype(op, "b", b, torch.bfloat16)
    _operands(op, a, b, d, c)


def _cast_input(op: str, x: object) -> torch.Tensor:
    """The adapter's check_dim + view of x, then the fork's cast checks (cast.cpp)."""
    if not isinstance(x, torch.Tensor):
        vc.fail(f"{op}: x must be a tensor, got an undefined tensor (None)")
    assert isinstance(x, torch.Tensor)
    if x.dim() != 2:
        vc.fail(f"{op}: x must be 2-D, got {x.dim()}-D tensor of shape {vc.shape(x)}")
    x = _view(op, "x", x, None)
    if x.dtype not in (torch.bfloat16, torch.float32):
        vc.fail(f"{op}: x must be bfloat16 or float32, got {_fork_dtype(x)}")
    return x


# New e4m3 values of x's shape and fp32 scales, one per 1 x gran_k group.
@torch.library.register_fake(f"{NAMESPACE}::per_token_cast_to_fp8")
def _per_token_cast_fake(
    x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = 128
) -> tuple[torch.Tensor, torch.Tensor]:
    op = f"{NAMESPACE}::per_token_cast_to_fp8"
    vc.to_int(op, "gran_k", gran_k)
    if gran_k <= 0:
        vc.fail(f"{op}: gran_k must be positive, got {gran_k}")
    x = _cast_input(op, x)
    m, k = x.shape
    return x.new_empty((m, k), dtype=torch.float8_e4m3fn), x.new_empty((m, _ceil_div(k, gran_k)), dtype=torch.float32)


# New e4m3 values of x's shape and fp32 scales, one per 128 x 128 block.
@torch.library.register_fake(f"{NAMESPACE}::per_block_cast_to_fp8")
def _per_block_cast_fake(x: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    x = _cast_input(f"{NAMESPACE}::per_block_cast_to_fp8", x)
    n, k = x.shape
    return (
        x.new_empty((n, k), dtype=torch.float8_e4m3fn),
        x.new_empty((_ceil_div(n, 128), _ceil_div(k, 128)), dtype=torch.float32),
    )
