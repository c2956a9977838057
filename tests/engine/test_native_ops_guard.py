"""`needs_ops` fails a test when keel's native library is missing or broken: the suite always runs
against the installed wheel, so a skip there would hide a broken build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import keel

pytestmark = pytest.mark.slow  # child pytest sessions, each importing torch and keel

TESTS = Path(__file__).resolve().parents[1]  # on the probe's PYTHONPATH, for `support`
PROBE = textwrap.dedent("""
    from support.native import keel_native_ops, needs_ops  # noqa: F401

    pytestmark = needs_ops

    def test_uses_ops():
        from keel import ops
        assert ops.rms_norm
""")


def _run_probe(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(TESTS)) if p)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "test_probe.py"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)


def _broken_copy(tmp_path: Path) -> Path:
    """A copy of the installed keel package without keel/_C.abi3.so, first on the path."""
    site = tmp_path / "site"
    shutil.copytree(Path(keel.__file__).parent, site / "keel", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "keel" / "_C.abi3.so").unlink()
    return site


@pytest.mark.parametrize("how", ["missing", "refused"])
def test_broken_native_library_fails_instead_of_skipping(tmp_path, how):
    env = dict(os.environ)
    if how == "missing":
        env["PYTHONPATH"] = str(_broken_copy(tmp_path))
        expected = "_C.abi3.so is missing"
    else:
        env["KEEL_CPU_ISA"] = "avx9000"  # the loader refuses to load the kernels
        expected = "KEEL_CPU_ISA='avx9000'"
    (tmp_path / "run").mkdir()
    out = _run_probe(tmp_path / "run", env)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "1 error" in text and "skipped" not in text, text
    assert "keel's native ops did not load" in text and expected in text, text


def test_working_native_library_runs_the_test(tmp_path):
    out = _run_probe(tmp_path, dict(os.environ))
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr
