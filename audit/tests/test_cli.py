"""`keel-audit` / `python -m keel_audit` / keel's `keel audit` verb: exit codes, messages, --json."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from audit_support import make_wheel

from keel_audit.cli import main
from keel_audit.policy import STRICT_FILE

REPO = Path(__file__).resolve().parents[2]  # keel's checkout (audit/ sits in it)
KEEL_VERB = REPO / "src/keel/cli/audit.py"
needs_keel_checkout = pytest.mark.skipif(
    not KEEL_VERB.is_file(), reason="keel's `keel audit` verb is not beside audit/"
)


def test_pass_prints_floor(libs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = make_wheel(tmp_path / "w.whl", {"pkg/_C.abi3.so": libs["stable"]})
    assert main([str(wheel), "--target-torch", "2.10"]) == 0
    assert "result: PASS; torch floor 2.10" in capsys.readouterr().out


def test_gate_failure_exit_1(libs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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
        [sys.executable, "-m", "keel_audit", str(libs["stable"]), "--strict"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "STABLE" in proc.stdout


@needs_keel_checkout
def test_keel_verb_hands_every_argument_to_keel_audit(libs: dict[str, Path], tmp_path: Path, capsys) -> None:
    spec = importlib.util.spec_from_file_location("_keel_cli_audit", KEEL_VERB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.delegate([str(libs["stable"]), "--strict", "--allow", "stable*"]) == 0
    assert "STABLE" in capsys.readouterr().out
    source = tmp_path / "op.cpp"
    source.write_text("#include <torch/extension.h>\nat::Tensor f(at::Tensor x) { return x; }\n")
    assert module.delegate(["inventory", str(source)]) == 1  # the verbs of keel-audit too
    assert "torch/extension.h" in capsys.readouterr().out


# makes `import torch` and `import keel` fail in the child, as in a bare release-manager venv
_NO_TORCH = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "keel"):
            raise ImportError(f"{name} is not importable here")
sys.meta_path.insert(0, Refuse())
"""


def test_runs_without_torch_or_keel(libs: dict[str, Path], tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path / "w-0.1-cp310-abi3-linux_x86_64.whl",
        {"pkg/_C.abi3.so": libs["stable"], "pkg/_u.abi3.so": libs["mixed"]},
    )
    code = _NO_TORCH + (
        "try:\n    import torch\nexcept ImportError:\n    pass\nelse:\n    raise SystemExit('guard failed')\n"
        "from keel_audit import audit\n"
        f"r = audit([{str(wheel)!r}], target_torch='2.10')\n"
        "assert r.verdict == 'UNSTABLE' and r.torch_floor == '2.10' and r.exit_code == 1, r.render()\n"
        "assert not any(k.split('.')[0] in ('torch', 'keel') for k in sys.modules), 'imported torch or keel'\n"
        "from keel_audit.cli import main\n"
        "raise SystemExit(main([" + repr(str(libs["stable"])) + ", '--strict']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "STABLE" in proc.stdout


def test_policy_file_and_strict(libs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(libs["needs_cudart"])]) == 0  # default: dynamic cudart is a warning
    assert "WARNING [dynamic-cudart]" in capsys.readouterr().out
    assert main([str(libs["needs_cudart"]), "--strict"]) == 1
    assert "ERROR [dynamic-cudart]" in capsys.readouterr().out
    relaxed = tmp_path / "relaxed.json"
    strict = STRICT_FILE  # the shipped strict policy, extended by a file of the user's
    relaxed.write_text(
        json.dumps({"schema": 2, "name": "relaxed", "extends": str(strict), "severities": {"unstable": "warning"}})
    )
    assert main([str(libs["mixed"]), "--policy", str(relaxed)]) == 0
    assert "policy relaxed" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": 2, "extends": str(strict), "severities": {"unstable": "fatal"}}))
    assert main([str(libs["mixed"]), "--policy", str(bad)]) == 2
    assert "expected one of error, warning, note" in capsys.readouterr().err


@needs_keel_checkout
def test_keel_verb_without_keel_audit(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("_keel_cli_audit2", KEEL_VERB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "keel_audit" else real(n, *a))
    assert module.delegate(["x.whl", "--strict"]) == 2
    assert "pip install ./audit" in capsys.readouterr().err
