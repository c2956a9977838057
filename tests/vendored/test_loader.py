"""Loading vendored libraries: what a missing or broken library says, and that a missing CUDA
twin leaves the CPU ops working while CUDA calls get an error naming the op and the cause."""

from __future__ import annotations

import textwrap

import pytest
from keel_dev.forked import run_python

from keel.vendored import VendoredLibraryError, _loader, load_vendored


def test_missing_library_names_it(tmp_path):
    with pytest.raises(VendoredLibraryError, match=r"keel\.vendored\.nope: native library _C\.abi3\.so is missing"):
        load_vendored("nope", "keel_nope", ["f"], directory=tmp_path)


def test_broken_library_gives_loader_reason(tmp_path):
    (tmp_path / "_C.abi3.so").write_bytes(b"\x7fELF but not really")
    with pytest.raises(VendoredLibraryError, match=r"keel\.vendored\.broken: cannot load .*_C\.abi3\.so with torch"):
        load_vendored("broken", "keel_broken", ["f"], directory=tmp_path)
    assert "broken" not in _loader.loaded_vendored()


def test_import_keel_does_not_load_vendored_libraries(tmp_path):
    code = "import keel, keel.vendored._loader as l; print(sorted(l.loaded_vendored()))"
    out = run_python(code, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_missing_cuda_twin_keeps_cpu_and_refuses_cuda(tmp_path):
    # a CUDA build of torch whose vendored CUDA twin is absent: the CPU library still loads and
    # each op gets a CUDA kernel that raises with the library, op and cause (no GPU needed here)
    code = textwrap.dedent(f"""
        import shutil, torch, keel
        from pathlib import Path
        import keel.vendored._loader as l
        from keel import _native
        src = Path(l.__file__).parent
        libs = sorted(p.parent for p in src.glob("*/_C.abi3.so"))
        if not libs:
            print("SKIP no vendored library in this build"); raise SystemExit(0)
        torch.version.cuda = "13.0"
        # the libraries' _ops modules load at import from the package folder: point it at the copies,
        # so a CUDA twin present in this build (unloadable on CPU torch) is absent for the test
        l._DIR = Path({str(tmp_path)!r})
        for folder in libs:
            dest = Path({str(tmp_path)!r}) / folder.name
            dest.mkdir()
            shutil.copy(folder / "_C.abi3.so", dest / "_C.abi3.so")
            mod = __import__(f"keel.vendored.{{folder.name}}._ops", fromlist=["NAMESPACE", "OPS"])
            lib = l.load_vendored(folder.name, mod.NAMESPACE, mod.OPS, directory=dest)
            assert lib.cuda is None and "_C_cuda.abi3.so is missing" in lib.cuda_error, lib
            for op in mod.OPS:
                kernel = _native.cuda_stubs[f"{{mod.NAMESPACE}}::{{op}}"]
                try:
                    kernel()
                except RuntimeError as exc:
                    assert f"{{mod.NAMESPACE}}::{{op}}: got a CUDA tensor" in str(exc), exc
                    assert "_C_cuda.abi3.so is missing from" in str(exc), exc
                else:
                    raise AssertionError("no error")
        print("OK", len(libs))
    """)
    out = run_python(code, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    if out.stdout.startswith("SKIP"):
        pytest.skip(out.stdout.strip())
    assert out.stdout.startswith("OK"), out.stdout
