"""The manylinux floor counts GLIBCXX_ / CXXABI_ / GCC_ versions, as auditwheel does.

Fixtures: stub libraries named like glibc, libstdc++, libgcc_s and the loader (sonames libc.so.6,
libstdc++.so.6, libgcc_s.so.1, ld-linux-x86-64.so.2), whose version scripts define exactly the
symbol versions a test needs; each fixture library links against them with -nostdlib, so its
version needs are the chosen ones on any build machine. auditwheel (a test requirement) is the
oracle where installed: its own policy choice for the same version needs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from audit_support import load_script, make_wheel

from keel_audit import audit
from keel_audit.manylinux import manylinux_table

# stub soname -> {version: [symbols]} (a version node per entry, in order)
STUBS = {
    "libc.so.6": {
        "GLIBC_2.5": ["k_glibc_2_5"],
        "GLIBC_2.17": ["k_glibc_2_17"],
        "GLIBC_2.32": ["k_glibc_2_32"],
        "GLIBC_2.34": ["k_glibc_2_34"],
        "GLIBC_PRIVATE": ["k_glibc_private"],
    },
    "libstdc++.so.6": {
        "GLIBCXX_3.4.29": ["k_cxx_3_4_29"],
        "GLIBCXX_3.4.30": ["k_cxx_3_4_30"],
        "GLIBCXX_3.4.99": ["k_cxx_3_4_99"],
        "CXXABI_1.3.13": ["k_abi_1_3_13"],
        "CXXABI_TM_1": ["k_abi_tm_1"],
    },
    "libgcc_s.so.1": {"GCC_3.0": ["k_gcc_3_0"], "GCC_12.0.0": ["k_gcc_12_0_0"]},
    "ld-linux-x86-64.so.2": {"GLIBC_2.35": ["k_ld_2_35"]},
}
# fixture -> the stub symbols it calls (their versions are the fixture's version needs)
USERS = {
    "cxx30": ["k_glibc_2_34", "k_cxx_3_4_30", "k_abi_1_3_13", "k_gcc_3_0"],
    "cxx29": ["k_glibc_2_34", "k_cxx_3_4_29", "k_abi_1_3_13"],
    "glibc34": ["k_glibc_2_34"],
    "glibc32": ["k_glibc_2_17", "k_glibc_2_32"],
    "gcc12": ["k_glibc_2_17", "k_gcc_12_0_0"],
    "cxx99": ["k_glibc_2_17", "k_cxx_3_4_99"],
    "tm": ["k_glibc_2_5", "k_abi_tm_1"],
    "loader": ["k_glibc_2_17", "k_ld_2_35"],
    "private": ["k_glibc_2_17", "k_glibc_private"],
    "no_glibc": ["k_cxx_3_4_29"],
    "none": [],
}

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="fixtures are linked for x86_64")


@pytest.fixture(scope="module")
def versioned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every fixture library, linked against the stubs (skips without gcc)."""
    if not shutil.which("gcc"):
        pytest.skip("gcc not available to build ELF fixtures")
    d = tmp_path_factory.mktemp("versioned")
    for soname, nodes in STUBS.items():
        script = "".join(f"{v} {{ global: {'; '.join(syms)}; }};\n" for v, syms in nodes.items())
        (d / f"{soname}.map").write_text(script)
        src = d / f"{soname}.c"
        src.write_text("".join(f"void {s}(void) {{}}\n" for syms in nodes.values() for s in syms))
        subprocess.run(
            [
                "gcc",
                "-shared",
                "-fPIC",
                "-nostdlib",
                f"-Wl,-soname,{soname}",
                f"-Wl,--version-script,{d / f'{soname}.map'}",
                "-o",
                str(d / soname),
                str(src),
            ],
            check=True,
        )
    owner = {s: soname for soname, nodes in STUBS.items() for syms in nodes.values() for s in syms}
    out = {}
    for name, calls in USERS.items():
        src = d / f"{name}.c"
        src.write_text(
            "".join(f"extern void {s}(void);\n" for s in calls)
            + f"void keel_{name}(void) {{ {' '.join(f'{s}();' for s in calls)} }}\n"
        )
        stubs = [f"-l:{soname}" for soname in dict.fromkeys(owner[s] for s in calls)]
        subprocess.run(
            [
                "gcc",
                "-shared",
                "-fPIC",
                "-nostdlib",
                "-o",
                str(d / f"{name}.so"),
                str(src),
                f"-L{d}",
                "-Wl,--no-as-needed",
                *stubs,
            ],
            check=True,
        )
        out[name] = d / f"{name}.so"
    return out


def _wheel(tmp_path: Path, lib: Path, plat: str) -> Path:
    return make_wheel(
        tmp_path / f"fixture-0.1-cp310-abi3-{plat}.whl", {"pkg/_ext.abi3.so": lib}, tag=f"cp310-abi3-{plat}"
    )


def _errors(result) -> set[str]:
    return {f.code for f in result.findings if f.fatal}


# fixture -> (library floor, glibc_max) ; the floors are auditwheel's (test_auditwheel_agrees)
FLOORS = {
    "cxx30": ("2.35", "2.34"),
    "cxx29": ("2.34", "2.34"),
    "glibc34": ("2.34", "2.34"),
    "glibc32": ("2.34", "2.32"),  # no 2.32/2.33 policy: the oldest admitting one is 2.34
    "gcc12": ("2.35", "2.17"),  # GCC_12.0.0 (libgcc_s of GCC 12) first in manylinux_2_35 on x86_64
    "tm": ("2.17", "2.5"),  # CXXABI_TM_1 (non-numeric) first in manylinux_2_17
    "loader": ("2.17", "2.35"),  # the loader's versions do not count (auditwheel skips ld-linux)
    "cxx99": (None, "2.17"),  # above every known policy
    "private": (None, "2.17"),  # GLIBC_PRIVATE is in no policy
    "no_glibc": ("2.34", None),  # GLIBCXX_3.4.29 alone bounds it
    "none": (None, None),  # no versioned platform symbol: nothing bounds it, no floor
}
UNKNOWN = {"cxx99", "private"}


@pytest.mark.parametrize("name", sorted(FLOORS))
def test_library_floor(name: str, versioned: dict[str, Path]) -> None:
    result = audit([str(versioned[name])])
    (lib,) = result.libraries
    assert (lib.manylinux_floor, lib.glibc_max) == FLOORS[name]
    assert result.manylinux_floor == FLOORS[name][0]
    unknown = [f for f in result.findings if f.code == "manylinux-floor-unknown"]
    assert bool(unknown) == (name in UNKNOWN)
    if unknown:
        assert unknown[0].severity == "warning" and "above every manylinux policy" in unknown[0].message


def test_gcc_and_cxx_versions_collected(versioned: dict[str, Path]) -> None:
    (lib,) = audit([str(versioned["cxx30"])]).libraries
    assert (lib.glibcxx_max, lib.cxxabi_max, lib.gcc_max) == ("3.4.30", "1.3.13", "3.0")
    (lib,) = audit([str(versioned["tm"])]).libraries
    assert lib.named_versions == ("CXXABI_TM_1",)


def test_package_floor_is_the_newest_library_floor(versioned: dict[str, Path]) -> None:
    assert audit([str(versioned["glibc34"]), str(versioned["cxx30"])]).manylinux_floor == "2.35"
    # one library above every known policy: the package has no floor, not a guessed one
    assert audit([str(versioned["glibc34"]), str(versioned["cxx99"])]).manylinux_floor is None


@pytest.mark.parametrize(
    ("name", "plat", "errors"),
    [
        ("cxx30", "manylinux_2_34_x86_64", {"libstdcxx-above-tag"}),
        ("cxx30", "manylinux_2_35_x86_64", set()),
        # between known policies: judged by manylinux_2_31 (GLIBCXX <= 3.4.28)
        ("cxx29", "manylinux_2_33_x86_64", {"libstdcxx-above-tag", "glibc-above-tag"}),
        ("cxx29", "manylinux_2_34_x86_64", set()),
        ("gcc12", "manylinux_2_34_x86_64", {"libstdcxx-above-tag"}),
        ("tm", "manylinux2014_x86_64", set()),
        ("tm", "manylinux_2_12_x86_64", {"libstdcxx-above-tag"}),
        # GLIBC only: today's result, glibc-above-tag and nothing else
        ("glibc34", "manylinux_2_34_x86_64", set()),
        ("glibc34", "manylinux_2_31_x86_64", {"glibc-above-tag"}),
        # a tag above every known policy proves nothing about a newer version: a warning, no error
        ("cxx99", "manylinux_2_45_x86_64", set()),
        ("cxx99", "manylinux_2_41_x86_64", {"libstdcxx-above-tag"}),
    ],
)
def test_tag_gate(name: str, plat: str, errors: set[str], versioned: dict[str, Path], tmp_path: Path) -> None:
    for strict in (False, True):
        result = audit([str(_wheel(tmp_path, versioned[name], plat))], strict=strict)
        assert _errors(result) - {"torch-requirement-missing"} == errors, (strict, result.render())


def test_libstdcxx_message(versioned: dict[str, Path], tmp_path: Path) -> None:
    result = audit([str(_wheel(tmp_path, versioned["cxx30"], "manylinux_2_34_x86_64"))])
    (f,) = [f for f in result.findings if f.code == "libstdcxx-above-tag"]
    assert f.library == "pkg/_ext.abi3.so" and f.symbols == ("GLIBCXX_3.4.30",)
    assert "GLIBCXX_3.4.30" in f.message and "manylinux_2_34_x86_64" in f.message
    assert "GLIBCXX at most GLIBCXX_3.4.29" in f.message and "manylinux floor 2.35" in f.message
    result = audit([str(_wheel(tmp_path, versioned["cxx29"], "manylinux_2_33_x86_64"))])
    (f,) = [f for f in result.findings if f.code == "libstdcxx-above-tag"]
    assert "at or below the tag is manylinux_2_31" in f.message and "GLIBCXX_3.4.28" in f.message


def test_floor_in_json_and_table(versioned: dict[str, Path], tmp_path: Path) -> None:
    result = audit([str(_wheel(tmp_path, versioned["cxx30"], "manylinux_2_35_x86_64"))])
    doc = result.to_json()
    assert doc["manylinux_floor"] == "2.35" and doc["libraries"][0]["manylinux_floor"] == "2.35"
    assert doc["libraries"][0]["gcc_max"] == "3.0"
    text = result.render()
    assert "manylinux" in text.splitlines()[2] and "glibc 2.34  manylinux 2.35" in text


def test_auditwheel_agrees(versioned: dict[str, Path]) -> None:
    """auditwheel's own policy choice for each fixture's version needs equals keel-audit's floor."""
    pytest.importorskip("auditwheel")
    from auditwheel.architecture import Architecture
    from auditwheel.elfutils import elf_find_versioned_symbols
    from auditwheel.libc import Libc
    from auditwheel.policy import WheelPolicies
    from elftools.elf.elffile import ELFFile

    policies = WheelPolicies(libc=Libc.GLIBC, arch=Architecture.x86_64)
    for name, path in versioned.items():
        with path.open("rb") as fh:
            needs: dict[str, set[str]] = {}
            for soname, version in elf_find_versioned_symbols(ELFFile(fh)):
                needs.setdefault(soname, set()).add(version)
        theirs = policies.versioned_symbols_policy(needs).name
        ours = audit([str(path)]).libraries[0].manylinux_floor
        # auditwheel calls a library that needs no version manylinux_2_5 (nothing bounds it); keel: no floor
        expected = (
            "linux_x86_64"
            if name in UNKNOWN
            else ("manylinux_2_5_x86_64" if ours is None else f"manylinux_{ours.replace('.', '_')}_x86_64")
        )
        assert theirs == expected, name


def _generator() -> ModuleType:
    return load_script("gen_manylinux_table")


def test_committed_table_is_the_generators_output() -> None:
    """data/manylinux_policy.json equals what the generator makes of the installed auditwheel's file."""
    if importlib.util.find_spec("auditwheel") is None:
        pytest.skip("auditwheel not installed (requirements-test.txt)")
    from keel_audit.manylinux import TABLE_FILE

    assert TABLE_FILE.read_text(encoding="utf-8") == _generator().generate()


def test_generator_skips_non_numeric_versions(tmp_path: Path) -> None:
    policies = [
        {"name": "linux", "symbol_versions": {}},
        {
            "name": "manylinux_2_17",
            "symbol_versions": {
                "x86_64": {
                    "GLIBC": ["2.2.5", "2.17", "2.9"],
                    "GLIBCXX": ["3.4", "3.4.19", "3.4.9"],
                    "CXXABI": ["1.3", "TM_1", "1.3.7"],
                    "GCC": ["3.0", "4.8.0"],
                }
            },
        },
        {
            "name": "manylinux_2_5",
            "symbol_versions": {
                "x86_64": {"GLIBC": ["2.5"], "GLIBCXX": ["3.4.8"], "CXXABI": ["1.3.1"], "GCC": ["4.2.0"]}
            },
        },
    ]
    table = json.loads(_generator().render(_generator().build_table(policies, "test")))
    assert table["policies"]["x86_64"] == {
        "2.5": {"GLIBC": "2.5", "GLIBCXX": "3.4.8", "CXXABI": "1.3.1", "GCC": "4.2.0"},
        "2.17": {"GLIBC": "2.17", "GLIBCXX": "3.4.19", "CXXABI": "1.3.7", "GCC": "4.8.0"},
    }
    assert table["named"] == {"x86_64": {"CXXABI_TM_1": "2.17"}}


def test_shipped_table_facts() -> None:
    """Spot checks against the manylinux policies (PEP 600 / auditwheel 6.8.2)."""
    table = manylinux_table()
    x86 = {b.glibc: b.highest for b in table.bounds("x86_64")}
    assert x86["2.34"]["GLIBCXX"] == "3.4.29" and x86["2.35"]["GLIBCXX"] == "3.4.30"
    assert x86["2.17"] == {"GLIBC": "2.17", "GLIBCXX": "3.4.19", "CXXABI": "1.3.7", "GCC": "4.8.0"}
    assert table.named["x86_64"]["GLIBC_ABI_DT_RELR"] == "2.36"


def _auditwheel_constraint(wheel: Path) -> str | None:
    """The platform tag auditwheel's symbol-version check allows for a wheel (`auditwheel show`)."""
    exe = shutil.which("auditwheel", path=str(Path(sys.executable).parent)) or shutil.which("auditwheel")
    if exe is None:
        pytest.skip("auditwheel not installed (requirements-test.txt)")
    proc = subprocess.run([exe, "show", str(wheel)], capture_output=True, text=True, check=False)
    text = " ".join(proc.stdout.split())
    found = re.findall(r'(?:constrains the platform tag to|following platform tag:) "(\w+)"', text)
    return found[-1] if found else None


def test_real_wheels_agree_with_auditwheel() -> None:
    """Opt-in (no network in the suite): every wheel of $KEEL_AUDIT_REAL_WHEELS (a folder of
    `pip download`ed x86_64 wheels, up to 50 MB each) gets auditwheel's tag as its manylinux floor."""
    folder = os.environ.get("KEEL_AUDIT_REAL_WHEELS")
    wheels = [w for w in sorted(Path(folder).glob("*x86_64*.whl")) if w.stat().st_size <= 50 << 20] if folder else []
    if not wheels:
        pytest.skip("set KEEL_AUDIT_REAL_WHEELS to a folder of downloaded x86_64 wheels")
    for wheel in wheels:
        floor = audit([str(wheel)]).manylinux_floor
        ours = f"manylinux_{floor.replace('.', '_')}_x86_64" if floor else "linux_x86_64"
        assert ours == _auditwheel_constraint(wheel), wheel.name
