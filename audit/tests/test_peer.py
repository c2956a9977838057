"""Where torch-abi-audit 0.3.0 (the public peer) disagrees with keel, record the case and why keel is right.

The peer cannot read wheels, so it audits the unpacked tree; keel audits the same tree.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import pytest

from keel_audit import audit

peer_cli = pytest.importorskip("torch_abi_audit.cli", reason="torch-abi-audit (test-only peer) not installed")
if not shutil.which("nm"):
    pytest.skip("torch-abi-audit needs nm", allow_module_level=True)

# case: (files, keel flags, keel exit, peer exit under --check torch, why keel is right)
CASES = {
    "stable": ({"pkg/_C.abi3.so": "stable"}, {"target_torch": "2.10"}, 0, 0, "agree"),
    "mixed": ({"pkg/_C.abi3.so": "mixed"}, {"target_torch": "2.10"}, 1, 1, "agree"),
    "vector-template-arg": ({"pkg/_C.abi3.so": "vector"}, {}, 1, 1, "agree"),
    "unknown-shim": (
        {"pkg/_C.abi3.so": "unknown"},
        {"target_torch": "2.10"},
        1,
        0,
        "peer counts any torch_* C symbol as stable; torch_frobnicate is in no torch release",
    ),
    "weak-c10-export": (
        {"pkg/_C.abi3.so": "weak_c10"},
        {},
        1,
        0,
        "peer reads only undefined symbols; an exported weak c10:: instantiation interposes torch's",
    ),
    "thp-global": (
        {"pkg/_C.abi3.so": "thp"},
        {},
        1,
        0,
        "peer matches only at::/c10::/torch:: text; THPVariableClass is a libtorch_python global",
    ),
    "bundled-so-n": (
        {"pkg/_C.abi3.so": "stable", "pkg.libs/libfoo.so.1": "libfoo"},
        {},
        1,
        0,
        "peer globs *.so only and never sees libfoo.so.1, which uses c10::",
    ),
    "newer-than-target": (
        {"pkg/_C.abi3.so": "newer"},
        {"target_torch": "2.10"},
        1,
        0,
        "peer has no target gate; torch_from_blob (2.11) fails to load on torch 2.10",
    ),
    "needs-libc10": (
        {"pkg/_C.abi3.so": "needs_c10"},
        {"target_torch": "2.10", "strict": True},
        1,
        0,
        "peer ignores DT_NEEDED; libc10.so exports a few std stream symbols, and a library linking it binds them there",
    ),
    "build-tree-runpath": (
        {"pkg/_C.abi3.so": "build_rpath"},
        {"target_torch": "2.10"},
        1,
        0,
        "peer ignores RUNPATH; a build-machine path can load the wrong torch",
    ),
    "dynamic-cudart": (
        {"pkg/_C.abi3.so": "needs_cudart"},
        {"target_torch": "2.10", "strict": True},
        1,
        0,
        "peer ignores DT_NEEDED; a dynamic libcudart.so.13 pins the CUDA major version",
    ),
    "header-only-export": ({"pkg/_C.abi3.so": "header_only_export"}, {"target_torch": "2.10"}, 0, 0, "agree"),
    "header-only-import": (
        {"pkg/_C.abi3.so": "header_only_import"},
        {"target_torch": "2.10"},
        0,
        1,
        "peer flags every undefined c10:: name; c10::toString(c10::ScalarType) is header-only torch code",
    ),
    "tensor-layout-export": (
        {"pkg/_C.abi3.so": "tensor_layout"},
        {},
        1,
        0,
        "peer reads only undefined symbols; mylib::pass<at::Tensor> compiles in at::Tensor's layout",
    ),
    "non-elf-so": (
        {"pkg/_C.abi3.so": "stable", "pkg/fake.so": "notelf"},
        {},
        2,
        0,
        "peer treats nm's failure as 'no symbols'; an unreadable .so cannot be declared fine",
    ),
    "truncated-elf": (
        {"pkg/_C.abi3.so": "truncated"},
        {},
        2,
        0,
        "peer treats nm's failure as 'no symbols'; a truncated object will not load",
    ),
}


def _peer_exit(tree: Path) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return peer_cli.main([str(tree), "--check", "torch"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_keel_vs_peer(case: str, libs: dict[str, Path], tmp_path: Path) -> None:
    files, flags, keel_exit, peer_exit, why = CASES[case]
    tree = tmp_path / "tree"
    for rel, fixture in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(libs[fixture], tree / rel)
    assert audit([tree], **flags).exit_code == keel_exit, why
    assert _peer_exit(tree) == peer_exit, f"peer behaviour changed for {case}: {why}"


def test_peer_reads_no_wheels(libs: dict[str, Path], tmp_path: Path) -> None:
    from audit_support import make_wheel

    wheel = make_wheel(tmp_path / "w-0.1-cp310-abi3-linux_x86_64.whl", {"pkg/_C.abi3.so": libs["unstable"]})
    assert audit([wheel]).exit_code == 1
    assert _peer_exit(wheel) == 2  # "not a compiled library"
