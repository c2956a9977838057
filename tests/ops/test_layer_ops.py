"""keel::layer_qkv and keel::layer_mlp, a decoder layer's step in two ops: the same bits as keel's separate ops in
the same order (the ops' definition, `keel.ops.layer`'s composition for callable projections), for every dtype,
bf16/fp32/fp16 or FP8 weights, with and without biases and q/k norms, decode and prompt row counts, strided inputs;
close to a plain-torch float64 reference; their fakes (opcheck) and their errors."""

from __future__ import annotations

import pytest
import torch

from keel import ops
from keel.ops import layer as layer_ops

H, KV, D, HIDDEN, INTER, BLOCKS, BS = 4, 2, 16, 64, 96, 6, 16
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


def projection(n: int, k: int, dtype: torch.dtype, fp8: bool, bias: bool, g: torch.Generator) -> tuple:
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    if not fp8:
        return (torch.randn(n, k, generator=g).div(k**0.5).to(dtype), None, b, None)
    q = (torch.randn(n, k, generator=g) * 8).to(torch.float8_e4m3fn)
    scale = torch.rand(n, -(-k // 128), generator=g) / k**0.5 + 0.01
    return (q, scale, b, ops.fp8_special_rows(q))


def qkv_case(dtype, fp8, bias, qk_norm, t, with_x, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    x = r(t, HIDDEN) if with_x else None
    slots = torch.randperm(BLOCKS * BS, generator=g)[:t]
    slots[0] = -1  # a padding token: not written
    norms = (r(D).abs(), r(D).abs()) if qk_norm else (None, None)
    cos_sin = torch.randn(512, D, generator=g).to(dtype)
    return dict(
        x=x, residual=r(t, HIDDEN), norm_weight=r(HIDDEN).abs(), eps=1e-5,
        qkv=projection((H + 2 * KV) * D, HIDDEN, dtype, fp8, bias, g), q_norm_weight=norms[0], k_norm_weight=norms[1],
        positions=torch.randint(0, 512, (t,), generator=g), cos_sin_cache=cos_sin, num_heads=H, num_kv_heads=KV,
        key_cache=r(BLOCKS, BS, KV, D), value_cache=r(BLOCKS, BS, KV, D), slot_mapping=slots,
    )  # fmt: skip


def cloned(case: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in case.items()}


def as_callable(p: tuple):
    return lambda x: layer_ops.project(x, p)  # the same op, through the composition


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fp8", [False, True], ids=["float", "fp8"])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["", "qk_norm"])
@pytest.mark.parametrize("t", [1, 37])
@pytest.mark.parametrize("with_x", [False, True], ids=["first", "x"])
def test_layer_qkv_gives_the_separate_ops_bits(dtype, fp8, qk_norm, t, with_x):
    case = qkv_case(dtype, fp8, bias=not qk_norm, qk_norm=qk_norm, t=t, with_x=with_x)
    fused, composed = cloned(case), cloned(case)
    composed["qkv"] = as_callable(composed["qkv"])
    q1, q2 = ops.layer_qkv(**fused), ops.layer_qkv(**composed)
    assert q1.shape == (t, H, D) and q1.dtype == dtype and q1.is_contiguous()
    for name, a, b in (("q", q1, q2), *((k, fused[k], composed[k]) for k in ("residual", "key_cache", "value_cache"))):
        assert torch.equal(bits(a), bits(b)), f"{name} differs"
    if with_x:
        assert torch.equal(fused["x"], case["x"])  # x is read, never written


def mlp_case(dtype, fp8, bias, t, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return dict(
        attn=r(t, H * D), residual=r(t, HIDDEN), o=projection(HIDDEN, H * D, dtype, fp8, False, g),
        norm_weight=r(HIDDEN).abs(), eps=1e-6, gate_up=projection(2 * INTER, HIDDEN, dtype, fp8, bias, g),
        down=projection(HIDDEN, INTER, dtype, fp8, bias, g),
    )  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fp8", [False, True], ids=["float", "fp8"])
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("t", [1, 37])
def test_layer_mlp_gives_the_separate_ops_bits(dtype, fp8, bias, t):
    case = mlp_case(dtype, fp8, bias, t)
    fused, composed = cloned(case), cloned(case)
    for k in ("o", "gate_up", "down"):
        composed[k] = as_callable(composed[k])
    out1, out2 = ops.layer_mlp(**fused), ops.layer_mlp(**composed)
    assert out1.shape == (t, HIDDEN) and out1.dtype == dtype
    assert torch.equal(bits(out1), bits(out2))
    assert torch.equal(bits(fused["residual"]), bits(composed["residual"]))


def test_rows_do_not_depend_on_the_call():
    """Row r of a 37-row call has the bits of the same row computed alone (decode and prompt share one order)."""
    case = mlp_case(torch.bfloat16, False, True, 37)
    want = ops.layer_mlp(**cloned(case))
    for r in (0, 17, 36):
        one = cloned(case)
        one["attn"], one["residual"] = case["attn"][r : r + 1].clone(), case["residual"][r : r + 1].clone()
        assert torch.equal(bits(ops.layer_mlp(**one))[0], bits(want)[r])


def test_strided_inputs():
    case = qkv_case(torch.bfloat16, False, True, False, 5, True)
    strided = cloned(case)
    strided["x"] = torch.cat([case["x"], case["x"]], 1)[:, :HIDDEN]  # rows 2 * HIDDEN apart
    strided["residual"] = case["residual"].clone().t().contiguous().t()  # column-major
    want, got = ops.layer_qkv(**cloned(case)), ops.layer_qkv(**strided)
    assert torch.equal(bits(got), bits(want))
    m = mlp_case(torch.float32, True, True, 5)
    m2 = cloned(m)
    m2["attn"] = m["attn"].t().contiguous().t()
    assert torch.equal(ops.layer_mlp(**cloned(m)), ops.layer_mlp(**m2))


def reference_layer(case_q: dict, case_m: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer in float64 plain torch (no rounding between steps): q after rotary, and the MLP output."""

    def f64(v):
        if isinstance(v, tuple):
            return tuple(f64(e) for e in v)
        return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    c = {k: f64(v) for k, v in case_q.items()}

    def norm(v, w):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + c["eps"]) * w

    res = c["residual"] + c["x"]
    q = (norm(res, c["norm_weight"]) @ c["qkv"][0].T + c["qkv"][2]).view(-1, H + 2 * KV, D)[:, :H]
    cos, sin = c["cos_sin_cache"][c["positions"]].chunk(2, -1)
    q1, q2 = q.chunk(2, -1)
    q = torch.cat([q1 * cos[:, None] - q2 * sin[:, None], q2 * cos[:, None] + q1 * sin[:, None]], -1)
    m = {k: f64(v) for k, v in case_m.items()}
    res = m["residual"] + m["attn"] @ m["o"][0].T
    gate, up = (norm(res, m["norm_weight"]) @ m["gate_up"][0].T + m["gate_up"][2]).chunk(2, -1)
    return q, (torch.nn.functional.silu(gate) * up) @ m["down"][0].T + m["down"][2]


def test_close_to_a_float64_reference():
    cq, cm = qkv_case(torch.float32, False, True, False, 9, True), mlp_case(torch.float32, False, True, 9)
    want_q, want_out = reference_layer(cq, cm)
    torch.testing.assert_close(ops.layer_qkv(**cloned(cq)).double(), want_q, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ops.layer_mlp(**cloned(cm)).double(), want_out, rtol=1e-4, atol=1e-4)


def op_args(case: dict, projections: tuple[str, ...]) -> tuple:
    args = []
    for k, v in case.items():
        args += list(v) if k in projections else [v]
    return tuple(args)


@pytest.mark.parametrize("fp8", [False, True], ids=["float", "fp8"])
def test_opcheck(fp8):
    # (opcheck's schema test runs aten ops that have no float8 CPU kernel: fp8 weights skip it, as fp8_linear's do)
    utils = ("test_faketensor", "test_autograd_registration") if fp8 else None
    kw = {} if utils is None else {"test_utils": utils}
    for qk_norm in (False, True):
        case = qkv_case(torch.bfloat16, fp8, not qk_norm, qk_norm, 3, qk_norm)
        case["slot_mapping"] = torch.tensor([-1, 5, 40])
        torch.library.opcheck(torch.ops.keel.layer_qkv.default, op_args(case, ("qkv",)), **kw)
    case = mlp_case(torch.float32, fp8, True, 3)
    torch.library.opcheck(torch.ops.keel.layer_mlp.default, op_args(case, ("o", "gate_up", "down")), **kw)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(qkv=(c["qkv"][0].half(), *c["qkv"][1:])), r"qkv_weight must be float8_e4m3fn or have the dtype of residual \(bfloat16\), got float16"),
        (lambda c: c.update(qkv=(c["qkv"][0], torch.ones(1), None, None)), r"qkv_scale is only for a float8_e4m3fn qkv_weight, got a bfloat16 qkv_weight"),
        (lambda c: c.update(qkv=(c["qkv"][0].to(torch.float8_e4m3fn), None, None, None)), r"qkv_scale must be given for a float8_e4m3fn qkv_weight"),
        (lambda c: c.update(qkv=(c["qkv"][0][:, :8], None, None, None)), r"qkv_weight must be \[128, 64\] \(rows: \(num_heads \+ 2 \* num_kv_heads\) \* head_size\), got \[128, 8\]"),
        (lambda c: c.update(q_norm_weight=c["norm_weight"][:D].clone()), r"q_norm_weight and k_norm_weight must be given together"),
        (lambda c: c.update(value_cache=c["value_cache"][:2]), r"value_cache must have the shape of key_cache"),
        (lambda c: c.update(positions=c["positions"].int()), r"positions must be int64, got int32"),
        (lambda c: c.update(slot_mapping=torch.tensor([3, 3, 3])), r"slot_mapping\[0\] and slot_mapping\[1\] are both 3"),
        (lambda c: c.update(positions=torch.tensor([0, 1, 9999])), r"positions\[2\]=9999 is outside cos_sin_cache's 512 rows"),
        (lambda c: c.update(residual=c["x"]), r"residual and x share memory"),
    ],
)  # fmt: skip
def test_layer_qkv_errors_name_the_op_and_argument(change, message):
    case = qkv_case(torch.bfloat16, False, False, False, 3, True)
    change(case)
    with pytest.raises(RuntimeError, match="keel::layer_qkv: " + message):
        ops.layer_qkv(**case)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(attn=c["attn"][:2]), r"attn must be \[3, K\] \(a row per row of residual\), got shape \[2, 64\]"),
        (lambda c: c.update(gate_up=(c["gate_up"][0][:-1], None, None, None)), r"gate_up_weight must have an even number of rows"),
        (lambda c: c.update(down=(c["down"][0][:, :8], None, None, None)), r"down_weight must be \[64, 96\] \(rows: the last dim of residual\)"),
        (lambda c: c.update(o=(*c["o"][:2], torch.zeros(3), None)), r"o_bias must be \[64\] to match o_weight's rows, got \[3\]"),
    ],
)  # fmt: skip
def test_layer_mlp_errors_name_the_op_and_argument(change, message):
    case = mlp_case(torch.float32, False, False, 3)
    change(case)
    with pytest.raises(RuntimeError, match="keel::layer_mlp: " + message):
        ops.layer_mlp(**case)
