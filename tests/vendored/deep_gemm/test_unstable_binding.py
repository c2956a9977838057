"""Why the adapter exists: the same fork bound the way upstream-style projects do (torch/library.h,
(Tensor, Tensor) tuple arguments, at::Tensor) works, but keel's audit calls it UNSTABLE; the
adapter-built keel/vendored/deep_gemm/_C.abi3.so is STABLE with floor 2.10."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from keel_audit import audit
from support.dg_reference import fp8_reference

from keel.vendored import deep_gemm as dg

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
FORK = ROOT / "vendored_deps" / "deep_gemm"
CXX = shutil.which("g++") or shutil.which("c++")
TORCH = Path(torch.__file__).resolve().parent
ISA_FLAGS = {
    "base": [],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16"],
}


def _build_unstable(out: Path) -> Path:
    """The fork's sources plus tests/.../unstable_binding.cpp, linked against libtorch's C++ API."""
    common = [CXX, "-std=c++17", "-O1", "-fPIC", f"-I{FORK}"]
    objects = []
    jobs = []
    for isa, flags in ISA_FLAGS.items():
        obj = out / f"kernels_{isa}.o"
        jobs.append(
            common
            + flags
            + [
                f"-DVENDORED_CPU_ISA_NS=cpu_{isa}",
                f"-DVENDORED_CPU_ISA_{isa.upper()}=1",
                "-c",
                str(FORK / "csrc/cpu/gemm_kernels.cpp"),
                "-o",
                str(obj),
            ]
        )
        objects.append(obj)
    for src in ("apis/gemm.cpp", "apis/runtime.cpp", "apis/cast.cpp"):
        obj = out / (Path(src).stem + ".o")
        jobs.append(common + ["-c", str(FORK / "csrc" / src), "-o", str(obj)])
        objects.append(obj)
    binding = out / "binding.o"
    jobs.append(
        [*common, "-std=c++20"]  # the last -std wins: torch 2.14's own headers use C++20 `requires` clauses
        + [
            f"-isystem{TORCH / 'include'}",
            f"-isystem{TORCH / 'include/torch/csrc/api/include'}",
            "-c",
            str(HERE / "unstable_binding.cpp"),
            "-o",
            str(binding),
        ]
    )
    objects.append(binding)
    procs = [subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True) for cmd in jobs]
    for cmd, p in zip(jobs, procs, strict=True):
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, f"{' '.join(cmd)}\n{err[-3000:]}"
    lib = out / "deep_gemm_unstable.so"
    link = [CXX, "-shared", "-o", str(lib), *map(str, objects), f"-L{TORCH / 'lib'}", "-ltorch_cpu", "-lc10"]
    res = subprocess.run(link, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return lib


@pytest.mark.skipif(
    not (CXX and (HERE / "unstable_binding.cpp").is_file() and FORK.is_dir()),
    reason="needs a C++ compiler and the source tree",
)
@pytest.mark.slow  # a native build of the fork, bound the upstream way
def test_upstream_style_binding_is_unstable_adapter_is_stable(tmp_path):
    lib = _build_unstable(tmp_path)
    result = audit([str(lib)], target_torch="2.10")
    (la,) = result.libraries
    assert la.verdict == "UNSTABLE", result.render()
    assert la.unstable_symbols, "an at::Tensor binding must need unstable libtorch/libc10 symbols"

    adapter = Path(dg.LIBRARY.cpu)
    stable = audit([str(adapter)], target_torch="2.10", strict=True)
    (sa,) = stable.libraries
    assert sa.verdict == "STABLE" and sa.torch_floor == "2.10" and not sa.unstable_symbols, stable.render()

    # both bindings run the same fork: the same numbers (up to -O1 vs -O3 code) through the tuple schema and the split one
    torch.ops.load_library(str(lib))
    g = torch.Generator().manual_seed(1)
    (a, sfa), (b, sfb) = (
        dg.per_token_cast_to_fp8(torch.randn(2, 200, generator=g)),
        dg.per_block_cast_to_fp8(torch.randn(9, 200, generator=g)),
    )
    d_unstable, d_stable = torch.empty(2, 9), torch.empty(2, 9)
    torch.ops.deep_gemm_unstable.fp8_gemm_nt((a, sfa), (b, sfb), d_unstable, None, 128)
    dg.fp8_gemm_nt((a, sfa), (b, sfb), d_stable)
    assert dg.calc_diff(d_unstable, d_stable) < 1e-12
    assert dg.calc_diff(d_stable, fp8_reference(a, sfa, b, sfb)) < 1e-9
