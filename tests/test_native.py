"""Native library loading: what is loaded, and the messages when loading cannot work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import keel
from keel import _native


def test_cpu_library_loaded_and_cuda_only_on_cuda_torch():
    loaded = _native.loaded_libraries()
    assert "_C" in loaded
    assert ("_C_cuda" in loaded) == bool(torch.version.cuda)
    assert keel.ops.rms_norm is not None


def test_too_old_torch_names_the_floor(monkeypatch):
    monkeypatch.setattr(_native, "_loaded", {})
    monkeypatch.setattr(_native, "torch_version", lambda: (2, 9))
    with pytest.raises(_native.NativeLibraryError, match=r"keel needs torch>=2\.\d+ .* but torch .* is installed"):
        _native.load()


def test_missing_library_says_where(monkeypatch, tmp_path):
    monkeypatch.setattr(_native, "_loaded", {})
    monkeypatch.setattr(_native, "_PACKAGE_DIR", tmp_path)
    with pytest.raises(_native.NativeLibraryError, match=r"_C\.abi3\.so is missing from .*this keel was not built"):
        _native.load()


def test_broken_library_gives_loader_reason(monkeypatch, tmp_path):
    (tmp_path / "_C.abi3.so").write_bytes(b"not an ELF file")
    monkeypatch.setattr(_native, "_loaded", {})
    monkeypatch.setattr(_native, "_PACKAGE_DIR", tmp_path)
    with pytest.raises(_native.NativeLibraryError, match=r"cannot load .*_C\.abi3\.so with torch .*: .*"):
        _native.load()


# A wheel built with KEEL_CUDA=off on a CUDA build of torch: simulated in a child process (torch
# claims CUDA; _C_cuda.abi3.so is missing, or fails to load). The CPU ops must keep working and
# every keel op must get a CUDA kernel that raises, naming the op and the reason.
CUDA_TORCH_SCRIPT = r"""
import pathlib, sys, torch
torch.version.cuda = "13.0"
mode = sys.argv[1]
real_is_file = pathlib.Path.is_file
present = mode != "missing"  # "broken": the file is there (or pretends to be) but does not load
pathlib.Path.is_file = lambda p: present if p.name == "_C_cuda.abi3.so" else real_is_file(p)
if mode == "broken":
    real_load = torch.ops.load_library
    def load(path):
        if str(path).endswith("_C_cuda.abi3.so"):
            raise OSError("libcudart.so.13: cannot open shared object file")
        return real_load(path)
    torch.ops.load_library = load
import keel
from keel import _native
from keel._oplist import KEEL_OPS
st = _native.load_status()
assert st.cuda is None and not st.cuda_ok, st
assert "_C_cuda" not in _native.loaded_libraries()
a = torch.randn(3, 4)
torch.testing.assert_close(keel.ops.fused_muladd(a, a, 1.0), a * a + 1.0)
for op in KEEL_OPS:
    assert getattr(torch.ops.keel, op).default.has_kernel_for_dispatch_key("CUDA"), op
stub = _native.missing_cuda_kernel("keel::rms_norm", st.cpu.parent / "_C_cuda.abi3.so", st.cuda_reason)
try:
    stub(a)
except RuntimeError as exc:
    print(exc)
"""


@pytest.mark.skipif(bool(torch.version.cuda), reason="simulates a CUDA torch on a CPU-only torch")
@pytest.mark.parametrize(
    "mode, reason",
    [
        ("missing", r"is missing from .*keel \(this wheel was built without CUDA kernels\)"),
        ("broken", r"could not be loaded with torch .*libcudart\.so\.13: cannot open shared object file"),
    ],
)
def test_cuda_torch_without_cuda_library(tmp_path, mode, reason):
    from keel_dev.forked import run_python

    out = run_python(CUDA_TORCH_SCRIPT, mode, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert re.search(
        r"keel::rms_norm: got a CUDA tensor, but the CUDA kernels of this op are not available: "
        r"_C_cuda\.abi3\.so " + reason + r"\. The CPU kernels work",
        out.stdout,
    ), out.stdout


def test_load_pair_is_generic(tmp_path, monkeypatch):
    # the vendored libraries reuse it: a missing CPU library is fatal and says where it looked
    with pytest.raises(_native.NativeLibraryError, match=r"_C\.abi3\.so is missing from .*"):
        _native.load_pair(tmp_path, "keel_deep_gemm", ["fp8_gemm_nt"])


def test_unknown_cpu_isa_refused(monkeypatch):
    monkeypatch.setenv("KEEL_CPU_ISA", "avx9000")
    with pytest.raises(
        _native.NativeLibraryError, match=r"KEEL_CPU_ISA='avx9000' .* expected one of auto, base, avx2, avx512, amx"
    ):
        _native.check_cpu_isa_env()
    for name in ("auto", "base", "avx2", "avx512", "amx"):
        monkeypatch.setenv("KEEL_CPU_ISA", name)
        _native.check_cpu_isa_env()


def test_vendored_loader_refuses_an_unknown_cpu_isa(monkeypatch):
    from keel.vendored import _loader

    monkeypatch.setenv("KEEL_CPU_ISA", "avx9000")
    with pytest.raises(
        _loader.VendoredLibraryError,
        match=r"keel\.vendored\.probe: keel: KEEL_CPU_ISA='avx9000' .* expected one of auto, base, avx2, avx512, amx",
    ):
        _loader.load_vendored("probe", "keel_probe", [])


def test_one_torch_floor():
    """TORCH_FLOOR is written once (src/keel/_settings.py); the build's default target is that floor."""
    from keel import _settings

    root = Path(__file__).resolve().parents[1]
    owners = [
        str(p.relative_to(root))
        for p in root.glob("src/keel/**/*.py")
        if re.search(r"^\s*TORCH_FLOOR\s*=", p.read_text(), re.M)
    ]
    assert owners == ["src/keel/_settings.py"], owners
    floor = ".".join(map(str, _settings.TORCH_FLOOR))
    assert f'os.environ.get("KEEL_TORCH_TARGET", "{floor}")' in (root / "setup.py").read_text()
    assert f'set(KEEL_TORCH_TARGET "{floor}"' in (root / "CMakeLists.txt").read_text()
