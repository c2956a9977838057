"""`keel audit` / `python -m keel.audit`: exit codes, messages, --json, and setup.py-style loading."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from keel_audit.cli import main

from .conftest import make_wheel

REPO = Path(__file__).resolve().parents[2]


def test_pass_prints_floor(libs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = make_wheel(tmp_path / "w.whl", {"pkg/_C.abi3.so": libs["stable"]})
    assert main([str(wheel), "--target-torch", "2.10"]) == 0
    assert "result: PASS; torch floor 2.10" in capsys.readouterr().out


def test_gate_failure_exit_1(
    libs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = make_wheel(tmp_path / "w.whl", {"pkg/_C.abi3.so": libs["newer"]})
    assert main([str(wheel), "--target-torch", "2.10", "--json"]) == 1
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["passed"] is False and "shim-newer-than-target" in {f["code"] for f in doc["findings"]}
    assert "gate failed" in captured.err


def test_bad_target_exit_2(libs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(libs["stable"]), "--target-torch", "two"]) == 2
    assert "--target-torch: expected a version like 2.10" in capsys.readouterr().err


def test_invalid_elf_exit_2(libs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(libs["notelf"])]) == 2
    assert "not an ELF file" in capsys.readouterr().out


def test_python_m(libs: dict[str, Path], tmp_path: Path) -> None:
    # run outside the checkout: `python -m` puts the working directory first on sys.path
    proc = subprocess.run(
        [sys.executable, "-m", "keel.audit", str(libs["stable"]), "--require-stable"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "STABLE" in proc.stdout


def test_cli_verb_registers() -> None:
    spec = importlib.util.spec_from_file_location("_keel_cli_audit", REPO / "keel/cli/audit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parser = argparse.ArgumentParser()
    module.register(parser.add_subparsers())
    args = parser.parse_args(["audit", "x.whl", "--allow", "a*", "--allow", "b*"])
    assert args.allow == ["a*", "b*"] and args.func is not None


def test_loads_by_file_path_like_setup_py(libs: dict[str, Path]) -> None:
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('_keel_audit', 'keel/audit/__init__.py', "
        "submodule_search_locations=['keel/audit'])\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['_keel_audit'] = m\n"
        "spec.loader.exec_module(m)\n"
        f"r = m.audit([{str(libs['stable'])!r}], target_torch='2.10')\n"
        "assert r and r.torch_floor == '2.10', r.render()\n"
        "assert not any(k == 'keel' or k.startswith('keel.') for k in sys.modules), 'imported keel'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
