"""`keel-audit preflight` on fixtures built here: two fake torch builds (wheels packed from tiny
libraries compiled in the test), target libraries that need a symbol the new build lacks, a
SONAME it does not ship, another CUDA runtime, a symbol version it does not define; every
prediction is checked against the real dynamic loader (`ctypes.CDLL(..., RTLD_NOW)` in a fresh
process with the candidate's libraries on LD_LIBRARY_PATH). The opt-in test at the end reads real
downloaded wheels (KEEL_PREFLIGHT_WHEELS=folder with vllm 0.33.0 and torch 2.12.1 / 2.13.0 wheels).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from audit_support import compile_library, make_wheel

from keel_audit.cli import main
from keel_audit.preflight import preflight

SHIM_OLD = "int aoti_torch_a(void) { return 1; }\nint torch_b(void) { return 2; }\n"
SHIM_NEW = SHIM_OLD + "int torch_new_thing(void) { return 3; }\n"
VSCRIPT = "FOO_1 { global: foo_v1; };\nFOO_2 { global: foo_v2; } FOO_1;\n"


def _torch_wheel(path: Path, libdir: Path, cuda: str | None, tag: str = "cp311-cp311-linux_x86_64") -> Path:
    files: dict[str, Path | bytes] = {f"torch/lib/{p.name}": p for p in sorted(libdir.iterdir()) if ".so" in p.name}
    files["torch/version.py"] = f"__version__ = '9.9.0'\ncuda = {cuda!r}\n".encode()
    files["torch/__init__.py"] = b""
    return make_wheel(path, files, tag=tag, requires=())


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """old/ and new/ torch builds (libtorch_cpu.so; new/ adds torch_new_thing and a libfoo with FOO_2),
    nvidia runtimes 12 and 13, and the target libraries linked against new/."""
    if not shutil.which("gcc"):
        pytest.skip("gcc not available to build ELF fixtures")
    d = tmp_path_factory.mktemp("preflight")
    old, new, cu12, cu13, tgt = (d / n for n in ("old", "new", "cu12", "cu13", "tgt"))
    for folder in (old, new, cu12, cu13, tgt):
        folder.mkdir()
    (d / "v1.map").write_text("FOO_1 { global: foo_v1; };\n")
    (d / "v2.map").write_text(VSCRIPT)
    soname = ("-Wl,-soname,libtorch_cpu.so",)
    compile_library(old / "libtorch_cpu.so", "c", SHIM_OLD, soname)
    compile_library(new / "libtorch_cpu.so", "c", SHIM_NEW, soname)
    compile_library(
        old / "libfoo.so.1",
        "c",
        "int foo_v1(void){return 1;}\n",
        ("-Wl,-soname,libfoo.so.1", f"-Wl,--version-script={d / 'v1.map'}"),
    )
    compile_library(
        new / "libfoo.so.1",
        "c",
        "int foo_v1(void){return 1;}\nint foo_v2(void){return 2;}\n",
        ("-Wl,-soname,libfoo.so.1", f"-Wl,--version-script={d / 'v2.map'}"),
    )
    compile_library(
        cu12 / "libcudart.so.12", "c", "int cudaMalloc(void){return 0;}\n", ("-Wl,-soname,libcudart.so.12",)
    )
    compile_library(
        cu13 / "libcudart.so.13", "c", "int cudaMalloc(void){return 0;}\n", ("-Wl,-soname,libcudart.so.13",)
    )
    # a library named libtorch_cpu.so whose SONAME is libtorch_cpu.so.2: what links it records that
    sonamed = d / "so2"
    sonamed.mkdir()
    compile_library(sonamed / "libtorch_cpu.so", "c", SHIM_NEW, ("-Wl,-soname,libtorch_cpu.so.2",))
    link = ("-L" + str(new), "-Wl,--no-as-needed", "-l:libtorch_cpu.so")
    targets = {
        "good": ("int t_good(void){ extern int aoti_torch_a(void); return aoti_torch_a(); }\n", link),
        "needs_new": ("extern int torch_new_thing(void);\nint t_new(void){ return torch_new_thing(); }\n", link),
        "weak_new": (
            "extern int torch_new_thing(void) __attribute__((weak));\n"
            "int t_weak(void){ return torch_new_thing ? torch_new_thing() : 0; }\n",
            link,
        ),
        "wrong_soname": (
            "extern int torch_b(void);\nint t_so(void){ return torch_b(); }\n",
            ("-L" + str(sonamed), "-Wl,--no-as-needed", "-l:libtorch_cpu.so"),
        ),
        "cuda12": (
            "extern int cudaMalloc(void); extern int aoti_torch_a(void);\n"
            "int t_cu(void){ return cudaMalloc() + aoti_torch_a(); }\n",
            (*link, "-L" + str(cu12), "-l:libcudart.so.12"),
        ),
        "versioned": (
            "extern int foo_v2(void);\nint t_ver(void){ return foo_v2(); }\n",
            ("-L" + str(new), "-Wl,--no-as-needed", "-l:libfoo.so.1"),
        ),
        "pyext": (
            "extern int aoti_torch_a(void);\nvoid* PyInit_pyext(void){ return (void*)(long)aoti_torch_a(); }\n",
            link,
        ),
    }
    out = {k: compile_library(tgt / f"{k}.abi3.so", "c", src, args) for k, (src, args) in targets.items()}
    out |= {"old": old, "new": new, "cu12": cu12, "cu13": cu13, "dir": d}
    out["old_whl"] = _torch_wheel(d / "torch-9.9.0-cp311-cp311-linux_x86_64.whl", old, "13.0")
    out["new_whl"] = _torch_wheel(d / "torch-9.9.1-cp311-cp311-linux_x86_64.whl", new, "13.0")
    out["cpu_whl"] = _torch_wheel(d / "torch-9.9.1+cpu-cp311-cp311-linux_x86_64.whl", new, None)
    out["cu13_whl"] = make_wheel(
        d / "nvidia_cuda_runtime-13.0-py3-none-manylinux_2_28_x86_64.whl",
        {"nvidia/cu13/lib/libcudart.so.13": cu13 / "libcudart.so.13"},
        tag="py3-none-manylinux_2_28_x86_64",
        requires=(),
    )
    return out


def _loads(lib: Path, *dirs: Path) -> bool:
    """What the real loader says: dlopen(RTLD_NOW) in a fresh process with `dirs` on LD_LIBRARY_PATH."""
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(map(str, dirs))}
    code = f"import ctypes, os; ctypes.CDLL({str(lib)!r}, os.RTLD_NOW)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True).returncode == 0


def _one(result, name: str):  # type: ignore[no-untyped-def]
    return next(lib for lib in result.libraries if lib.path.endswith(f"{name}.abi3.so"))


CASES = ["good", "needs_new", "weak_new", "wrong_soname", "cuda12", "versioned"]


@pytest.mark.parametrize("candidate", ["old", "new"])
def test_prediction_matches_the_loader(world: dict[str, Path], candidate: str) -> None:
    """Every fixture's predicted verdict against the old and the new build equals what dlopen does."""
    whl = world[f"{candidate}_whl"]
    libdir = world[candidate]
    paths = [str(world[c]) for c in CASES]
    result = preflight(paths, str(whl), also=[str(world["cu13_whl"])], host=False)
    for case in CASES:
        lib = _one(result, case)
        observed = _loads(world[case], libdir, world["cu13"])
        assert lib.loads == observed, (case, candidate, lib)


def test_missing_symbol_is_named_with_its_library(world: dict[str, Path]) -> None:
    result = preflight([str(world["needs_new"])], str(world["old_whl"]), host=False)
    lib = _one(result, "needs_new")
    assert not lib.loads and result.exit_code == 1
    assert [(m.symbol, m.expected_from) for m in lib.missing] == [("torch_new_thing", "libtorch_cpu.so")]
    ok = preflight([str(world["needs_new"])], str(world["new_whl"]), host=False)
    assert ok.exit_code == 0 and _one(ok, "needs_new").loads


def test_weak_undefined_is_not_required(world: dict[str, Path]) -> None:
    lib = _one(preflight([str(world["weak_new"])], str(world["old_whl"]), host=False), "weak_new")
    assert lib.loads and not lib.missing and lib.counts.get("weak", 0) >= 1  # gcc adds weak __gmon_start__ etc. too


def test_wrong_soname_is_an_unprovided_needed_entry(world: dict[str, Path]) -> None:
    lib = _one(preflight([str(world["wrong_soname"])], str(world["new_whl"]), host=False), "wrong_soname")
    assert not lib.loads
    assert [n for n, _why in lib.unprovided] == ["libtorch_cpu.so.2"]


def test_cuda_major_mismatch(world: dict[str, Path]) -> None:
    result = preflight([str(world["cuda12"])], str(world["new_whl"]), also=[str(world["cu13_whl"])], host=False)
    lib = _one(result, "cuda12")
    assert not lib.loads
    assert lib.cuda["target"] == "12" and lib.cuda["candidate"] == "13" and not lib.cuda["ok"]
    assert [n for n, _w in lib.unprovided] == ["libcudart.so.12"]
    assert "CUDA 13.0" in dict(lib.unprovided)["libcudart.so.12"]
    # the same library with a CUDA 12 runtime among the candidate's libraries loads (mismatch still reported)
    fine = _one(
        preflight([str(world["cuda12"])], str(world["new_whl"]), also=[str(world["cu12"])], host=False), "cuda12"
    )
    assert fine.loads and not fine.cuda["ok"]


def test_cuda_library_on_a_cpu_only_build(world: dict[str, Path]) -> None:
    lib = _one(preflight([str(world["cuda12"])], str(world["cpu_whl"]), host=False), "cuda12")
    assert not lib.loads and "CPU-only" in lib.cuda["note"]


def test_versioned_symbol_needs_its_version(world: dict[str, Path]) -> None:
    bad = _one(preflight([str(world["versioned"])], str(world["old_whl"]), host=False), "versioned")
    assert not bad.loads
    assert ("libfoo.so.1", "FOO_2") in bad.missing_versions
    assert [(m.symbol, m.version) for m in bad.missing] == [("foo_v2", "FOO_2")]
    good = _one(preflight([str(world["versioned"])], str(world["new_whl"]), host=False), "versioned")
    assert good.loads and good.counts.get("torch") == 1


def test_python_abi_floor_against_the_candidates_tag(world: dict[str, Path]) -> None:
    whl = make_wheel(
        world["dir"] / "t-1.0-cp312-abi3-linux_x86_64.whl",
        {"t/pyext.abi3.so": world["pyext"]},
        tag="cp312-abi3-linux_x86_64",
    )
    lib = _one(preflight([str(whl)], str(world["new_whl"]), host=False), "pyext")
    assert lib.loads and not lib.python_ok and lib.verdict == "loads, wrong Python ABI"
    ok = make_wheel(
        world["dir"] / "t-1.0-cp39-abi3-linux_x86_64.whl",
        {"t/pyext.abi3.so": world["pyext"]},
        tag="cp39-abi3-linux_x86_64",
    )
    assert preflight([str(ok)], str(world["new_whl"]), host=False).exit_code == 0


def test_candidate_wheel_members_are_read_only_when_needed(world: dict[str, Path]) -> None:
    """libfoo.so.1 is in the candidate, but nothing the target links reaches it: never inflated."""
    result = preflight([str(world["good"])], str(world["new_whl"]), host=False)
    assert result.candidate["libraries_read"] == ["libtorch_cpu.so"]


def test_installed_candidate_folder(world: dict[str, Path], tmp_path: Path) -> None:
    """A site-packages folder: torch/lib, torch/version.py and a torch dist-info's WHEEL tag."""
    site = tmp_path / "site"
    with zipfile.ZipFile(world["old_whl"]) as zf:
        zf.extractall(site)
    (site / "fixture-0.1.dist-info").rename(site / "torch-9.9.0.dist-info")
    result = preflight([str(world["needs_new"]), str(world["good"])], str(site), host=False)
    assert result.candidate["version"] == "9.9.0" and result.candidate["python_tag"] == "cp311"
    assert [lib.loads for lib in result.libraries] == [False, True]


def test_cli_exit_codes_and_json(world: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["preflight", str(world["good"]), "--torch", str(world["old_whl"]), "--no-host"]) == 0
    assert "1 of 1 library load" in capsys.readouterr().out
    assert main(["preflight", str(world["needs_new"]), "--torch", str(world["old_whl"]), "--no-host", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "keel-audit-preflight/1" and doc["ok"] is False
    assert doc["libraries"][0]["missing"][0]["symbol"] == "torch_new_thing"
    # unreadable inputs: 2, with the input named
    notelf = world["dir"] / "notelf.so"
    notelf.write_text("not an ELF file\n")
    assert main(["preflight", str(notelf), "--torch", str(world["old_whl"])]) == 2
    assert "notelf.so" in capsys.readouterr().err
    assert main(["preflight", str(world["good"]), "--torch", str(world["good"])]) == 2
    assert "expected a torch .whl" in capsys.readouterr().err
    assert main(["preflight", str(world["good"]), "--torch", str(world["cu13_whl"])]) == 2
    assert "no torch/version.py" in capsys.readouterr().err


REAL = os.environ.get("KEEL_PREFLIGHT_WHEELS")


@pytest.mark.skipif(
    not REAL, reason="opt-in: KEEL_PREFLIGHT_WHEELS=folder with vllm-0.33.0 and torch 2.12.1/2.13.0 wheels"
)
def test_real_vllm_against_torch_2_12_and_2_13() -> None:
    """vllm 0.33.0's stable-ABI libraries need shim symbols that torch 2.13 added (the audit's floor)."""
    folder = Path(str(REAL))
    vllm = next(folder.glob("vllm-0.33.0-*.whl"), None)
    t212 = next(folder.glob("torch-2.12.1-*.whl"), None)
    t213 = next(folder.glob("torch-2.13.0*.whl"), None)
    if vllm is None or t212 is None or t213 is None:
        pytest.skip(f"{folder}: expected vllm-0.33.0, torch-2.12.1 and torch-2.13.0 wheels")
    old = preflight([str(vllm)], str(t212), assume=["libcuda.so.1"])
    shim_missing = {m.symbol for lib in old.libraries for m in lib.missing if m.symbol.startswith("torch_")}
    assert "torch_exception_get_what" in shim_missing
    new = preflight([str(vllm)], str(t213), assume=["libcuda.so.1"])
    missing = {(m.symbol, m.expected_from) for lib in new.libraries for m in lib.missing}
    shims = {(s, f) for s, f in missing if s.startswith(("torch_", "aoti_"))}
    # a CPU-only 2.13.0 (this machine's) lacks only the CUDA shim functions, expected from libtorch_cuda.so
    assert shims and all("cuda" in s and f == "libtorch_cuda.so" for s, f in shims), shims
