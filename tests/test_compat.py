"""keel._compat: each private torch API keel uses, removed, must cost speed only: the fallback runs
and gives the same result. And no underscored torch API is used outside src/keel/_compat.py."""

from __future__ import annotations

import re
from pathlib import Path

import keel_dev.cpu
import pytest
import torch
from torch import nn

import keel
from keel import _compat, ops
from keel.engine.dtypes import default_dtype
from keel.layers import linear as cpu_linear

ONEDNN_BF16 = {"avx512f", "avx512bw", "avx512vl"}


def without(monkeypatch, *names: str) -> None:
    """keel's view of torch loses the private APIs `names` (torch itself keeps them)."""
    real = _compat.private
    monkeypatch.setattr(_compat, "private", lambda owner, name: None if name in names else real(owner, name))


def test_below_autograd_fallback_same_result(monkeypatch):
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    want = ops.fused_muladd(a, b, 0.5)
    assert hasattr(torch._C, "_AutoDispatchBelowAutograd")  # the fast path exists on the tested torch
    without(monkeypatch, "_AutoDispatchBelowAutograd")
    assert isinstance(_compat.below_autograd(), type(_compat.contextlib.nullcontext()))
    assert torch.equal(ops.fused_muladd(a, b, 0.5), want)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")
@pytest.mark.parametrize("missing", ["_reorder_linear_weight", "_linear_pointwise"])
def test_packed_linear_fallback_same_result(monkeypatch, missing):
    torch.manual_seed(0)
    lin = nn.Linear(32, 48).to(torch.bfloat16)
    x = torch.randn(20, 32, dtype=torch.bfloat16)  # 20 rows: the prefill (packed) path
    packed = cpu_linear.PackedLinear(lin)
    # oneDNN reorders bf16 weights for CPUs with AVX-512; an AVX2-only CPU refuses them and keel keeps F.linear
    assert (packed.packed is not None) == (ONEDNN_BF16 <= keel_dev.cpu.flags())
    want = packed(x)
    without(monkeypatch, missing)
    fallback = cpu_linear.PackedLinear(lin)
    assert fallback.packed is None
    got = fallback(x)
    ref = nn.functional.linear(x, lin.weight, lin.bias)
    assert torch.equal(got, ref)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)  # oneDNN sums in another order
    assert torch.equal(fallback(x[:3]), packed(x[:3]))  # decode rows: keel's GEMV either way


def test_linear_pointwise_disappearing_after_packing(monkeypatch):
    lin = nn.Linear(16, 8).to(torch.bfloat16)
    packed = cpu_linear.PackedLinear(lin)
    without(monkeypatch, "_linear_pointwise")
    x = torch.randn(20, 16, dtype=torch.bfloat16)
    assert torch.equal(packed(x), nn.functional.linear(x, lin.weight, lin.bias))


def test_native_bf16_probe_fallback_agrees(monkeypatch):
    private = _compat.cpu_has_native_bf16()
    dtype = default_dtype(torch.device("cpu"))
    without(monkeypatch, "_is_avx512_bf16_supported")
    assert _compat.cpu_has_native_bf16() == private  # /proc/cpuinfo says the same as torch's probe
    assert default_dtype(torch.device("cpu")) == dtype
    monkeypatch.setattr(_compat, "_cpuinfo_flags", lambda: set())
    assert _compat.cpu_has_native_bf16() is False  # unknown CPU: fp32, never a crash


def test_check_fallback_same_message(monkeypatch):
    with pytest.raises(RuntimeError, match="keel::x: bad"):
        _compat.check(False, lambda: "keel::x: bad")
    without(monkeypatch, "_check")
    with pytest.raises(RuntimeError, match="keel::x: bad"):
        _compat.check(False, lambda: "keel::x: bad")
    with pytest.raises(RuntimeError, match="keel::rms_norm: weight must be 1-D with 8 elements"):
        ops.rms_norm(torch.empty(2, 8, device="meta"), torch.empty(4, device="meta"), 1e-6)


def test_no_private_torch_api_outside_compat():
    root = Path(keel.__file__).parent
    private = re.compile(r"torch\.(?:[A-Za-z]\w*\.)*_[A-Za-z]\w*|torch\.ops\.mkldnn")
    found = []
    for path in root.rglob("*.py"):
        if path.name == "_compat.py" or "audit" in path.parts:  # keel.audit never imports torch
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if private.search(code.replace("torch.__version__", "")):
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert found == []


def test_op_entry_fallback_same_result(monkeypatch):
    """Without OpOverload._op the flat forward calls the overloads themselves: the same bits."""
    overload = torch.ops.keel.rms_norm.default
    x, w = torch.randn(3, 8), torch.randn(8)
    fast = _compat.op_entry(overload)
    assert fast is not overload  # the private entry exists on the tested torch
    want = fast(x, w, 1e-6)
    without(monkeypatch, "_op")
    assert _compat.op_entry(overload) is overload
    assert torch.equal(_compat.op_entry(overload)(x, w, 1e-6), want)
