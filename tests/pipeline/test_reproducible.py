"""The pipeline's reproducibility check (scripts/release/pipeline.py, check_reproducible): the release build is
made a second time from a copy of the checkout at another path, and every library must be the wheel's bytes and
name no path of the build machine. The rebuild itself runs in the pipeline (`bash scripts/demo.sh`), not here:
these tests hold the comparison to what it must find, on libraries of this wheel and altered copies of them."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest
from support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
WHEELS = sorted((ROOT / "dist").glob("keel-*.whl"))
pipeline = load_script("scripts/release/pipeline.py", "pipeline_checks")


def digests(libs: dict[str, bytes]) -> dict[str, str]:
    return {rel: hashlib.sha256(data).hexdigest() for rel, data in libs.items()}


@pytest.fixture(scope="module")
def libraries() -> dict[str, bytes]:
    if not WHEELS:
        pytest.skip("no dist/keel-*.whl: scripts/test.sh builds it before the suite")
    with zipfile.ZipFile(WHEELS[-1]) as z:
        return {n.removeprefix("keel/"): z.read(n) for n in z.namelist() if n.endswith(".abi3.so")}


def test_the_wheel_names_no_path_of_this_machine(libraries):
    paths = [str(ROOT), str(Path.home()), str(Path(pytest.__file__).resolve().parents[1])]
    assert libraries and pipeline.reproducibility_findings(libraries, digests(libraries), paths) == []


def test_a_changed_byte_a_missing_library_and_a_build_path_are_found(libraries):
    rel = sorted(libraries)[0]
    changed = {**libraries, rel: libraries[rel][:-1] + bytes([libraries[rel][-1] ^ 1])}
    assert pipeline.reproducibility_findings(changed, digests(libraries), []) == [f"{rel}: bytes differ"]
    fewer = dict(list(digests(libraries).items())[1:])
    assert pipeline.reproducibility_findings(libraries, fewer, []) == [f"{rel}: only in the wheel"]
    leaked = {**libraries, rel: libraries[rel] + b"\0/home/builder/keel/csrc/ops/linear.cpp\0"}
    found = pipeline.reproducibility_findings(leaked, digests(leaked), ["/home/builder/keel", "/"])
    assert found == [f"{rel}: names the build machine's path /home/builder/keel"]
