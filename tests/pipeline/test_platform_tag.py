"""The wheel's manylinux tag is the manylinux floor that keel's audit computes (GLIBC_, GLIBCXX_,
CXXABI_ and GCC_ versions against the manylinux policies), and auditwheel agrees.

Reads the wheel that scripts/test.sh (or scripts/release/build_wheel.sh) built into dist/.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEELS = sorted((ROOT / "dist").glob("keel-*.whl"))


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is missing: pip install -r requirements-test.txt"
    return found


@pytest.fixture(scope="module")
def wheel() -> Path:
    assert len(WHEELS) == 1, f"expected the one wheel built by scripts/test.sh in dist/, found {WHEELS}"
    return WHEELS[0]


def platform_tags(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/WHEEL"))
        return {
            line.split(":", 1)[1].strip().rsplit("-", 1)[1]
            for line in zf.read(meta).decode().splitlines()
            if line.startswith("Tag:")
        }


@pytest.fixture(scope="module")
def floor(wheel: Path) -> str:
    """The oldest manylinux policy (glibc "X.Y") that keel's audit finds admits the wheel."""
    proc = subprocess.run([tool("keel"), "audit", str(wheel), "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = json.loads(proc.stdout)["manylinux_floor"]
    assert found, "keel audit found no manylinux floor for keel's wheel"
    return found


def auditwheel_tag(wheel: Path) -> str:
    """The manylinux tag that the wheel's glibc / libstdc++ symbol versions allow, per auditwheel."""
    proc = subprocess.run([tool("auditwheel"), "show", str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = " ".join(proc.stdout.split())
    found = re.findall(r'(?:constrains the platform tag to|following platform tag:) "(manylinux_\d+_\d+_\w+)"', text)
    assert found, text
    return found[-1]


def test_wheel_tag_is_the_audited_manylinux_floor(wheel, floor):
    arch = "x86_64"
    expected = f"manylinux_{floor.replace('.', '_')}_{arch}"
    assert platform_tags(wheel) == {expected}
    assert f"-{expected}.whl" in wheel.name


def test_auditwheel_agrees_with_keel_audit(wheel, floor):
    assert auditwheel_tag(wheel) == f"manylinux_{floor.replace('.', '_')}_x86_64"
