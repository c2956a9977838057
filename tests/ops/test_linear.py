"""keel::linear against F.linear: keel's CPU kernel for every row count (one pass per 32-row block), aten::linear on CUDA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from keel_dev.forked import run_python
from support.devices import DEVICES, DTYPES, assert_rounded_like

from keel import ops

# fp32: the kernels sum in another order than torch; bf16/fp16: one rounding of the output
TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (1e-2, 1e-2), torch.float16: (1e-2, 1e-2)}


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double())


def _check(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    assert out.shape == (*x.shape[:-1], weight.shape[0]) and out.dtype == x.dtype and out.is_contiguous()
    atol, rtol = TOL[x.dtype]
    expected = reference_linear(x, weight, bias)
    scale = max(1.0, x.shape[-1] ** 0.5)  # values grow like sqrt(K) with unit-normal inputs
    torch.testing.assert_close(out.double(), expected, atol=atol * scale, rtol=rtol)
    # keel's CPU kernel: fp32 accumulation, one rounding to the output dtype, so almost every element is
    # torch's rounding of the exact result (truncation would make about half of them differ). Not claimed
    # on CUDA (aten::linear / cuBLAS).
    if x.dtype != torch.float32 and x.device.type == "cpu":
        assert_rounded_like(out, expected.to(x.dtype), x.dtype, max_ulps=None)


def _rand(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype=dtype, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 8, 16, 17, 40, 70])
@pytest.mark.parametrize("k, n", [(1, 7), (7, 1), (576, 960), (1536, 576), (33, 1536)], ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_matches_reference(device, dtype, m, k, n, with_bias):
    x = _rand((m, k), dtype, device, 1)
    weight = _rand((n, k), dtype, device, 2)
    bias = _rand((n,), dtype, device, 3) if with_bias else None
    _check(ops.linear(x, weight, bias), x, weight, bias)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [2, 24])
def test_strided_inputs(device, dtype, m):
    # weight rows padded (row stride > K), x and bias strided, x 3-D with a transposed leading pair
    k, n = 70, 45
    weight = _rand((n, k + 9), dtype, device, 4)[:, :k]
    bias = _rand((2 * n,), dtype, device, 5)[::2]
    x = _rand((m, 3, 2 * k), dtype, device, 6)[..., ::2].transpose(0, 1)
    _check(ops.linear(x, weight, bias), x, weight, bias)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3, 64), (0, 64), (4, 0, 64), (3, 0)], ids=str)
def test_shapes(device, shape):
    x = _rand(shape, torch.bfloat16, device, 7)
    weight = _rand((5, shape[-1]), torch.bfloat16, device, 8)
    bias = _rand((5,), torch.bfloat16, device, 9)
    _check(ops.linear(x, weight, bias), x, weight, bias)


def test_zero_out_features():
    out = ops.linear(torch.randn(3, 8), torch.randn(0, 8), None)
    assert out.shape == (3, 0)


@pytest.mark.slow  # a child process per CPU build (the default build runs in every other test)
@pytest.mark.parametrize("isa", ["base", "avx2"])
def test_cpu_isa_paths(isa, tmp_path):
    # the baseline and AVX2-without-AVX512-BF16 kernels, in a fresh process (the ISA is chosen once);
    # run outside the checkout: `python -c` puts the working directory first on sys.path
    import os

    code = (
        "import torch, torch.nn.functional as F\n"
        "from keel import ops\n"
        "tol = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (1e-1, 1e-2), torch.float16: (2e-2, 1e-2)}\n"
        "for dt in (torch.float32, torch.bfloat16, torch.float16):\n"
        "    for m in (1, 5, 16):\n"
        "        x, w, b = torch.randn(m, 77).to(dt), torch.randn(29, 77).to(dt), torch.randn(29).to(dt)\n"
        "        want = F.linear(x.float(), w.float(), b.float())\n"
        "        atol, rtol = tol[dt]\n"
        "        torch.testing.assert_close(ops.linear(x, w, b).float(), want, atol=atol, rtol=rtol)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "KEEL_CPU_ISA": isa}
    out = run_python(code, env=env, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_opcheck():
    for m in (4, 20):
        args = (torch.randn(m, 16), torch.randn(8, 16), torch.randn(8))
        torch.library.opcheck(torch.ops.keel.linear.default, args)
    torch.library.opcheck(torch.ops.keel.linear.default, (torch.randn(2, 3, 16), torch.randn(8, 16), None))


@pytest.mark.parametrize(
    "args, match",
    [
        (
            (torch.randn(2, 576), torch.randn(10, 512), None),
            r"keel::linear: weight must be \[N, 576\] to match x's last dim, got \[10, 512\]",
        ),
        (
            (torch.randn(2, 8), torch.randn(8), None),
            r"keel::linear: weight must be \[N, 8\] to match x's last dim, got \[8\]",
        ),
        (
            (torch.randn(2, 8), torch.randn(8, 4).t(), None),
            r"keel::linear: weight must have unit stride along its last dim \(K\), got stride 4",
        ),
        (
            (torch.randn(2, 8), torch.randn(4, 8), torch.randn(5)),
            r"keel::linear: bias must be \[4\] to match weight's rows, got \[5\]",
        ),
        (
            (torch.randn(2, 8), torch.randn(4, 8).bfloat16(), None),
            r"keel::linear: weight must have the dtype of x \(float32\), got bfloat16",
        ),
        (
            (torch.randn(2, 8), torch.randn(4, 8), torch.randn(4).half()),
            r"keel::linear: bias must have the dtype of x \(float32\), got float16",
        ),
        (
            (torch.randn(2, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64), None),
            r"keel::linear: x must be float32, bfloat16 or float16, got float64",
        ),
        ((torch.randn(()), torch.randn(4, 1), None), r"keel::linear: x must have at least 1 dimension"),
    ],
)
def test_bad_inputs(args, match):
    with pytest.raises(RuntimeError, match=match):
        ops.linear(*args)
