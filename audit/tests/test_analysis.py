"""Every fixture gets its expected package verdict, exit code and fatal findings."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from audit_support import make_wheel

from keel_audit import PackageAudit, audit
from keel_audit.classify import HEADER_ONLY, NO_TORCH_USE, UNSTABLE_USE, torch_use
from keel_audit.mangling import demangle
from keel_audit.symbol_tables import shim_table

# case: (files {wheel path: fixture}, flags, verdict, exit code, error finding codes)
CASES = {
    "stable": ({"pkg/_C.abi3.so": "stable"}, {"target_torch": "2.10"}, "STABLE", 0, set()),
    "unstable": ({"pkg/_C.abi3.so": "unstable"}, {}, "UNSTABLE", 1, {"unstable"}),
    "mixed": ({"pkg/_C.abi3.so": "mixed"}, {"target_torch": "2.10"}, "UNSTABLE", 1, {"unstable"}),
    "vector-template-arg": ({"pkg/_C.abi3.so": "vector"}, {}, "UNSTABLE", 1, {"unstable"}),
    "weak-c10-export": ({"pkg/_C.abi3.so": "weak_c10"}, {}, "UNSTABLE", 1, {"unstable"}),
    "tensor-layout-export": ({"pkg/_C.abi3.so": "tensor_layout"}, {}, "UNSTABLE", 1, {"unstable"}),
    "header-only-export": ({"pkg/_C.abi3.so": "header_only_export"}, {}, "STABLE", 0, set()),
    "header-only-and-layout-export": ({"pkg/_C.abi3.so": "mixed_layout"}, {}, "UNSTABLE", 1, {"unstable"}),
    "header-only-export-strict": (
        {"pkg/_C.abi3.so": "header_only_export"},
        {"strict": True},
        "STABLE",
        1,
        {"header-only-export"},
    ),
    "header-only-import": ({"pkg/_C.abi3.so": "header_only_import"}, {}, "STABLE", 0, set()),
    "header-only-import-strict": (
        {"pkg/_C.abi3.so": "header_only_import"},
        {"strict": True},
        "STABLE",
        1,
        {"header-only-import"},
    ),
    "late-header-only-import": ({"pkg/_C.abi3.so": "late_header_only"}, {}, "UNSTABLE", 1, {"unstable"}),
    "late-header-only-import-2.15": (
        {"pkg/_C.abi3.so": "late_header_only"},
        {"target_torch": "2.15"},
        "NO-TORCH",
        0,
        set(),
    ),
    "thp-global": ({"pkg/_C.abi3.so": "thp"}, {}, "UNSTABLE", 1, {"unstable"}),
    "non-limited-cpython": ({"pkg/_ext.abi3.so": "nonlimited"}, {}, "NO-TORCH", 1, {"cpython-non-limited"}),
    "newer-than-target": (
        {"pkg/_C.abi3.so": "newer"},
        {"target_torch": "2.10"},
        "STABLE",
        1,
        {"shim-newer-than-target", "torch-requirement-below-floor"},
    ),
    "unknown-shim": ({"pkg/_C.abi3.so": "unknown"}, {}, "UNSTABLE", 1, {"unknown-shim"}),
    "bundled-so-n": (
        {"pkg/_C.abi3.so": "stable", "pkg.libs/libfoo.so.1": "libfoo"},
        {},
        "UNSTABLE",
        1,
        {"unstable"},
    ),
    "bundled-allowed": (
        {"pkg/_C.abi3.so": "stable", "pkg.libs/libfoo.so.1": "libfoo"},
        {"allow": ["libfoo.so*"]},
        "UNSTABLE",
        0,
        set(),
    ),
    "stale-allow": ({"pkg/_C.abi3.so": "stable"}, {"allow": ["libgone*.so"]}, "STABLE", 1, {"stale-allow"}),
    "non-elf-so": ({"pkg/_C.abi3.so": "stable", "pkg/fake.so": "notelf"}, {}, "STABLE", 2, {"invalid-elf"}),
    "truncated-elf": ({"pkg/_C.abi3.so": "truncated"}, {}, "NO-TORCH", 2, {"invalid-elf"}),
    "needs-libc10": ({"pkg/_C.abi3.so": "needs_c10"}, {}, "STABLE", 0, set()),
    "needs-libc10-strict": ({"pkg/_C.abi3.so": "needs_c10"}, {"strict": True}, "STABLE", 1, {"needed-torch-library"}),
    "dynamic-cudart": ({"pkg/_C.abi3.so": "needs_cudart"}, {}, "STABLE", 0, set()),
    "dynamic-cudart-strict": ({"pkg/_C.abi3.so": "needs_cudart"}, {"strict": True}, "STABLE", 1, {"dynamic-cudart"}),
    "unneeded-libtorch": ({"pkg/_C.abi3.so": "needs_libtorch"}, {}, "STABLE", 0, set()),
    "libtorch-strict": ({"pkg/_C.abi3.so": "needs_libtorch"}, {"strict": True}, "STABLE", 1, {"needed-torch-library"}),
    "needs-libtorch-cpu": ({"pkg/_C.abi3.so": "needs_torch_cpu"}, {"strict": True}, "STABLE", 0, set()),
    "build-tree-runpath": ({"pkg/_C.abi3.so": "build_rpath"}, {}, "STABLE", 1, {"build-tree-runpath"}),
    "no-torch": ({"pkg/_plain.abi3.so": "plain"}, {"target_torch": "2.10"}, "NO-TORCH", 0, set()),
}
# warnings the default policy shows for the cases whose linkage is a policy question, not an ABI error
WARNINGS = {
    "header-only-export": {"header-only-export"},
    "header-only-import": {"header-only-import"},
    "late-header-only-import-2.15": {"header-only-import"},
    "needs-libc10": {"needed-torch-library"},  # not also "unneeded": one finding per library name
    "unneeded-libtorch": {"unneeded-torch-library"},
    "dynamic-cudart": {"dynamic-cudart"},
    "bundled-allowed": {"unstable"},
}


def _fatal(result: PackageAudit) -> set[str]:
    return {f.code for f in result.findings if f.fatal}


def _codes(result: PackageAudit, severity: str) -> set[str]:
    return {f.code for f in result.findings if f.severity == severity}


@pytest.mark.parametrize("case", sorted(CASES))
def test_wheel_case(case: str, libs: dict[str, Path], tmp_path: Path) -> None:
    files, flags, verdict, code, fatal = CASES[case]
    wheel = make_wheel(tmp_path / "fixture-0.1-cp310-abi3-linux_x86_64.whl", {k: libs[v] for k, v in files.items()})
    result = audit([wheel], **flags)
    assert (result.verdict, result.exit_code, _fatal(result)) == (verdict, code, fatal), result.render()
    assert bool(result) is (code == 0)
    if not flags.get("strict"):
        assert _codes(result, "warning") == WARNINGS.get(case, set()), result.render()


def test_floor_and_render(libs: dict[str, Path], tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "f-0.1-cp310-abi3-linux_x86_64.whl", {"pkg/_C.abi3.so": libs["stable"]})
    result = audit([wheel], target_torch="2.10")
    assert result.torch_floor == "2.10"
    assert result.libraries[0].floor_symbols == ("torch_call_dispatcher",)
    text = result.render()
    assert "torch floor 2.10" in text and "PASS" in text


def test_newer_passes_at_its_own_floor(libs: dict[str, Path], tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "f.whl", {"pkg/_C.abi3.so": libs["newer"]}, requires=("torch>=2.11",))
    result = audit([wheel], target_torch="2.11")
    assert (result.torch_floor, result.exit_code) == ("2.11", 0), result.render()


def test_python_floor_checked_against_tag(libs: dict[str, Path], tmp_path: Path) -> None:
    low = audit([make_wheel(tmp_path / "a.whl", {"pkg/_e.abi3.so": libs["pyfloor"]}, tag="cp310-abi3-linux_x86_64")])
    high = audit([make_wheel(tmp_path / "b.whl", {"pkg/_e.abi3.so": libs["pyfloor"]}, tag="cp312-abi3-linux_x86_64")])
    assert low.python_floor == "3.12" and _fatal(low) == {"python-floor-above-tag"}
    assert high.exit_code == 0


def test_python_floor_checked_against_requires_python(libs: dict[str, Path], tmp_path: Path) -> None:
    # a cp38-abi3 tag with Requires-Python >=3.12: no Python that can install it lacks 3.12's API
    covered = make_wheel(
        tmp_path / "a.whl",
        {"pkg/_e.abi3.so": libs["pyfloor"]},
        tag="cp38-abi3-linux_x86_64",
        requires_python=">=3.12,<3.15",
    )
    short = make_wheel(
        tmp_path / "b.whl", {"pkg/_e.abi3.so": libs["pyfloor"]}, tag="cp38-abi3-linux_x86_64", requires_python=">=3.11"
    )
    ok, bad = audit([covered]), audit([short])
    assert ok.exit_code == 0 and _codes(ok, "note") == {"python-floor-from-requires-python"}, ok.render()
    assert _fatal(bad) == {"python-floor-above-tag"} and "Requires-Python >=3.11" in bad.render()


@pytest.mark.parametrize(
    ("requires", "error", "warning"),
    [
        (("torch>=2.10",), set(), set()),
        (("torch >= 2.10 ; python_version >= '3'", "numpy"), set(), set()),
        (("torch>=2.9",), {"torch-requirement-below-floor"}, set()),
        (("torch",), {"torch-requirement-below-floor"}, set()),
        (("torch==2.14.0",), set(), {"torch-requirement-narrow"}),
        (("torch>=2.10,<2.13",), set(), {"torch-requirement-narrow"}),
        (("torch>=2.11",), set(), {"torch-requirement-narrow"}),
        # other distributions whose names start with "torch" are not torch's requirement
        (("torchvision>=0.20", "torch-abi-audit>=0.3", "torch>=2.10"), set(), set()),
        (("torchvision>=0.20", "torch-abi-audit>=0.3"), set(), {"torch-requirement-missing"}),
        (("torch>=2.9; extra == 'gpu'",), set(), {"torch-requirement-missing"}),
    ],
)
def test_torch_requirement_parsed(
    libs: dict[str, Path], tmp_path: Path, requires: tuple[str, ...], error: set[str], warning: set[str]
) -> None:
    wheel = make_wheel(tmp_path / "a.whl", {"pkg/_C.abi3.so": libs["stable"]}, requires=requires)
    result = audit([wheel])
    assert (_fatal(result), _codes(result, "warning")) == (error, warning), result.render()


def test_header_only_defined_by_the_package_is_no_import(libs: dict[str, Path], tmp_path: Path) -> None:
    # one library defines c10::toString(c10::ScalarType), the other imports it: resolved in the package
    wheel = make_wheel(
        tmp_path / "a.whl",
        {"pkg/_a.abi3.so": libs["header_only_export"], "pkg/_b.abi3.so": libs["header_only_import"]},
    )
    result = audit([wheel])
    assert _codes(result, "warning") == {"header-only-export"}, result.render()
    b = next(lib for lib in result.libraries if lib.path.endswith("_b.abi3.so"))
    assert b.verdict == "STABLE" and not b.header_only_imported


def test_header_only_symbols_listed(libs: dict[str, Path]) -> None:
    (lib,) = audit([libs["header_only_export"]]).libraries
    names = sorted(demangle(n) for n in lib.header_only_exported)
    assert names == ["c10::BFloat16 mylib::twice<c10::BFloat16>(c10::BFloat16)", "c10::toString(c10::ScalarType)"]
    (layout,) = audit([libs["tensor_layout"]]).libraries
    assert [demangle(n) for n in layout.unstable_exported] == ["at::Tensor mylib::pass<at::Tensor>(at::Tensor)"]


def test_machine_mismatch(libs: dict[str, Path], tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "a.whl", {"pkg/_C.abi3.so": libs["stable"]}, tag="cp310-abi3-linux_aarch64")
    assert _fatal(audit([wheel])) == {"machine-mismatch"}


def test_requirement_below_floor(libs: dict[str, Path], tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "a.whl", {"pkg/_C.abi3.so": libs["stable"]}, requires=("torch>=2.9",))
    assert _fatal(audit([wheel])) == {"torch-requirement-below-floor"}


def test_directory_and_files(libs: dict[str, Path], tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "pkg.libs").mkdir(parents=True)
    (tree / "pkg.libs" / "libfoo.so.1").write_bytes(libs["libfoo"].read_bytes())
    (tree / "_C.abi3.so").write_bytes(libs["stable"].read_bytes())
    by_dir = audit([tree])
    assert sorted(lib.path for lib in by_dir.libraries) == ["_C.abi3.so", "pkg.libs/libfoo.so.1"]
    assert by_dir.verdict == "UNSTABLE" and by_dir.exit_code == 1
    by_files = audit([libs["stable"], libs["weak_c10"]])
    assert [lib.verdict for lib in by_files.libraries] == ["STABLE", "UNSTABLE"]


@pytest.mark.parametrize("container", ["wheel", "directory"])
def test_damaged_executable_is_reported_not_dropped(libs: dict[str, Path], tmp_path: Path, container: str) -> None:
    """A file not named *.so that starts like an ELF shared object (a PIE executable such as
    vllm's `vllm-rs`) but is cut short is INVALID (exit 2), not silently left out."""
    data = libs["stable"].read_bytes()
    cut = data[: len(data) // 2]
    if container == "wheel":
        target = make_wheel(tmp_path / "w.whl", {"pkg/_C.abi3.so": libs["stable"], "pkg/bin/tool": cut})
    else:
        target = tmp_path / "tree"
        (target / "bin").mkdir(parents=True)
        (target / "bin" / "tool").write_bytes(cut)
        (target / "_C.abi3.so").write_bytes(data)
    result = audit([target])
    tool = next(lib for lib in result.libraries if lib.path.endswith("bin/tool"))
    assert (tool.verdict, result.exit_code) == ("INVALID", 2) and "truncated" in (tool.error or "")


def test_json_schema(libs: dict[str, Path], tmp_path: Path) -> None:
    doc = audit([libs["mixed"]], target_torch="2.10").to_json()
    assert doc["schema"] == "keel-audit/2"
    assert (doc["verdict"], doc["passed"], doc["exit_code"], doc["torch_floor"]) == (
        "UNSTABLE",
        False,
        1,
        "2.10",
    )
    lib = doc["libraries"][0]
    assert lib["verdict"] == "UNSTABLE" and lib["unstable_symbols"][0]["demangled"].startswith("c10::check")


def test_installed_distribution() -> None:
    result = audit(["pyelftools"])
    assert result.sources == ("pyelftools (installed)",)
    assert (result.verdict, result.exit_code, result.libraries) == ("NO-TORCH", 0, ())


def test_keels_own_wheel_if_built() -> None:
    wheels = sorted((Path(__file__).resolve().parents[2] / "dist").glob("keel-*.whl"))
    if not wheels:
        pytest.skip("no dist/keel-*.whl built")
    result = audit([wheels[-1]], target_torch="2.10", strict=True)
    assert result, result.render()
    with zipfile.ZipFile(wheels[-1]) as zf:  # the audit is its own distribution, not part of keel's wheel
        assert not [n for n in zf.namelist() if n.startswith(("keel_audit/", "keel/audit/"))]
    assert (result.verdict, result.torch_floor) == ("STABLE", "2.10")


def test_no_abi3_python_floor_once_non_limited_symbols_are_used(libs: dict[str, Path]) -> None:
    # PyLong_FromLong is limited API 3.2, but PyCode_Addr2Line is not limited at all: the library is
    # tied to one CPython version, so an abi3 floor would mislead
    (lib,) = audit([str(libs["nonlimited"])]).libraries
    assert lib.cpython_nonlimited == ("PyCode_Addr2Line",) and lib.python_floor is None


@pytest.mark.parametrize(
    ("name", "use"),
    [
        ("_ZN3c10plERKNS_8BFloat16ES2_", HEADER_ONLY),  # c10::operator+(BFloat16 const&, BFloat16 const&)
        ("_ZN3c10lsERSoRKNS_6DeviceE", UNSTABLE_USE),  # c10::operator<<(ostream&, c10::Device const&)
        ("_ZN3c10lsERSoi", UNSTABLE_USE),  # an operator in c10 alone says nothing header-only
        ("_ZN2at6nativeplERKN3c108BFloat16ES4_", UNSTABLE_USE),  # at::native::operator+(BFloat16...): libtorch
        ("_ZN3c108toStringENS_10ScalarTypeE", HEADER_ONLY),
        ("_ZN5torch6stable6TensorC1Ev", HEADER_ONLY),
        ("_ZN4vllm6kernelIN3c108BFloat16EEEvPT_", HEADER_ONLY),
        ("_ZN5mylib3fooEv", NO_TORCH_USE),
    ],
)
def test_torch_use_of_operators_and_templates(name: str, use: int) -> None:
    assert demangle(name) != name, "not a valid mangled name"
    assert torch_use(name, shim_table()) == use
