"""--fix on a small unstable extension (inventory_fixtures/unstable_ext: at::Tensor, TORCH_CHECK,
TORCH_LIBRARY, a dispatch macro): the diff plus the hand changes the report leaves (hand.json) give
a source with no unstable use that builds with TORCH_TARGET_VERSION 2.10 against the installed
torch, passes the binary audit with floor 2.10, and whose op runs; and (where those torches are
installed) the same build runs on torch 2.10 and 2.15."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from keel_audit import audit
from keel_audit.inventory.cli import main

FIXTURE = Path(__file__).resolve().parent / "inventory_fixtures" / "unstable_ext"
ROOT = Path(__file__).resolve().parents[2]
TARGET = "0x020a000000000000"  # TORCH_TARGET_VERSION 2.10
OP_CHECK = """
import sys, torch
torch.ops.load_library(sys.argv[1])
a, b = torch.randn(7, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
out = torch.ops.inventory_fixture.muladd(a, b, 2.0)
assert torch.allclose(out, a * b + 2.0), (out, a * b + 2.0)
assert torch.ops.inventory_fixture.muladd(a.float(), b.float(), 0.5).dtype == torch.float32
print(torch.__version__)
"""


def _migrate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, list[str]]:
    """The fixture copied to tmp_path (the working directory), the --fix diff applied with `patch`,
    then hand.json; returns
    the migrated file and the findings the report left after the diff."""
    if shutil.which("patch") is None:
        pytest.skip("patch(1) is not installed")
    work = tmp_path / "ext"
    shutil.copytree(FIXTURE, work)
    diff = tmp_path / "fix.diff"
    assert main(["ext", "--fix", str(diff), "--json"]) == 1
    before = json.loads(capsys.readouterr().out)
    subprocess.run(["patch", "-p1", "-i", str(diff)], cwd=tmp_path, check=True, capture_output=True)
    assert main(["ext", "--json"]) == 1
    left = [f["what"] for f in json.loads(capsys.readouterr().out)["findings"]]
    assert len(left) < len(before["findings"])
    source = work / "muladd.cpp"
    text = source.read_text()
    hand = json.loads((work / "hand.json").read_text())["changes"]
    for change in hand:
        assert text.count(change["find"]) == 1, change["find"]
        text = text.replace(change["find"], change["replace"])
    source.write_text(text)
    assert sorted(left) == sorted(w for change in hand for w in change["findings"])
    return source, left


def test_fix_then_hand_changes_leave_nothing_unstable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    source, left = _migrate(tmp_path, capsys)
    assert left == ["torch::empty", "a_c.options"]
    text = source.read_text()
    assert 'THO_DISPATCH_V2(a.scalar_type(), "muladd", AT_WRAP([&] {' in text and "}), AT_FLOATING_TYPES);" in text
    assert 'm.impl("muladd", TORCH_BOX(&muladd));' in text
    assert "torch::stable::Tensor a_c = torch::stable::contiguous(a);" in text
    assert main(["ext", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["findings"] == [] and doc["projects"][0]["torch_target_version"] == "2.10"


def _torch_include() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None or shutil.which("g++") is None:
        pytest.skip("needs torch and g++")
    return Path(spec.origin).parent


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The migrated extension built once: TORCH_TARGET_VERSION 2.10, the installed torch's headers,
    linked to libtorch_cpu only."""
    torch_dir = _torch_include()
    tmp = tmp_path_factory.mktemp("fix")
    cwd = os.getcwd()
    try:
        os.chdir(tmp)
        work = tmp / "ext"
        shutil.copytree(FIXTURE, work)
        diff = tmp / "fix.diff"
        with open(os.devnull, "w") as devnull:
            saved, sys.stdout = sys.stdout, devnull
            try:
                main(["ext", "--fix", str(diff)])
            finally:
                sys.stdout = saved
        subprocess.run(["patch", "-p1", "-i", str(diff)], cwd=tmp, check=True, capture_output=True)
        source = work / "muladd.cpp"
        text = source.read_text()
        for change in json.loads((work / "hand.json").read_text())["changes"]:
            text = text.replace(change["find"], change["replace"])
        source.write_text(text)
    finally:
        os.chdir(cwd)
    out = tmp / "muladd.so"
    cmd = ["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-fvisibility=hidden", f"-DTORCH_TARGET_VERSION={TARGET}"]
    cmd += [f"-I{torch_dir / 'include'}", str(source), f"-L{torch_dir / 'lib'}", "-ltorch_cpu", "-o", str(out)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    return out


@pytest.mark.slow
def test_migrated_extension_builds_passes_the_audit_and_runs(built: Path) -> None:
    result = audit([str(built)], target_torch="2.10")
    assert result.exit_code == 0, result.render()
    assert [lib.torch_floor for lib in result.libraries] == ["2.10"]
    run = subprocess.run([sys.executable, "-c", OP_CHECK, str(built)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


def _torch_venvs() -> list[Path]:
    """Pythons with torch 2.10 and 2.15: KEEL_INVENTORY_TORCH_PYTHONS (paths, os.pathsep), else the
    release pipeline's venvs in the checkout (.venv-pipe-py3.11-torch2.10.0, ...-torch2.15.0)."""
    given = os.environ.get("KEEL_INVENTORY_TORCH_PYTHONS")
    if given:
        return [Path(p) for p in given.split(os.pathsep)]
    return [ROOT / f".venv-pipe-py3.11-torch{v}/bin/python" for v in ("2.10.0", "2.15.0")]


@pytest.mark.slow
def test_one_build_runs_on_torch_2_10_and_2_15(built: Path) -> None:
    pythons = _torch_venvs()
    missing = [str(p) for p in pythons if not p.exists()]
    if missing:
        pytest.skip(f"needs Pythons with torch 2.10 and 2.15 (scripts/env.sh's keel_venv): missing {missing}")
    versions = []
    for python in pythons:
        run = subprocess.run([str(python), "-c", OP_CHECK, str(built)], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, f"{python}: {run.stderr[-3000:]}"
        versions.append(run.stdout.strip().split("+")[0])
    assert [v.rsplit(".", 1)[0] for v in versions] == ["2.10", "2.15"]
