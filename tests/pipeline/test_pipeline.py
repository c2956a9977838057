"""scripts/pipeline.py and its probe: what they prove can fail (the full run is `bash scripts/demo.sh`)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"_keel_script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


pipeline = load("pipeline")


def test_probe_hashes_what_the_process_mapped_not_what_lies_on_disk(tmp_path):
    """One child: keel loaded, then its probe asked about keel's folder and about a copy of _C."""
    script = (
        "import json, runpy, shutil, sys, torch; from pathlib import Path; import keel\n"
        "d = Path(keel.__file__).resolve().parent\n"
        "shutil.copy(d / '_C.abi3.so', sys.argv[1])  # the same bytes, never mapped\n"
        f"probe = runpy.run_path({str(ROOT / 'scripts' / 'demo_generate.py')!r}, run_name='probe')\n"
        "m = probe['mapped_keel_libraries']\n"
        "print(json.dumps({'dir': str(d), 'mapped': m(d), 'copy': m(Path(sys.argv[1]).parent),\n"
        "                  'cuda_torch': bool(torch.version.cuda)}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "_C.abi3.so")], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    keel_dir = Path(got["dir"])
    assert got["mapped"]["_C.abi3.so"] == hashlib.sha256((keel_dir / "_C.abi3.so").read_bytes()).hexdigest()
    assert got["copy"] == {}, "a file that was not mapped must not count"
    if (keel_dir / "_C_cuda.abi3.so").exists() and not got["cuda_torch"]:
        assert "_C_cuda.abi3.so" not in got["mapped"], "on a CPU torch the CUDA library is never loaded"


def test_compare_libraries_needs_equal_bytes_from_the_environment(tmp_path):
    env = tmp_path / "venv"
    keel_dir = str(env / "lib" / "site-packages" / "keel")
    built = {"_C.abi3.so": "a" * 64, "_C_cuda.abi3.so": "b" * 64}
    ok, text = pipeline.compare_libraries(built, {"_C.abi3.so": "a" * 64}, keel_dir, env)
    assert ok and "1/1" in text and "not loaded: _C_cuda.abi3.so" in text
    assert pipeline.compare_libraries(built, {"_C.abi3.so": "c" * 64}, keel_dir, env)[0] is False
    assert pipeline.compare_libraries(built, {}, keel_dir, env)[0] is False
    # a vendored library that is mapped but was not built: not the built code
    extra = {"_C.abi3.so": "a" * 64, "vendored/x/_C.abi3.so": "d" * 64}
    assert pipeline.compare_libraries(built, extra, keel_dir, env)[0] is False
    # the right bytes, but from another keel (the checkout, say)
    assert pipeline.compare_libraries(built, {"_C.abi3.so": "a" * 64}, str(ROOT / "keel"), env)[0] is False


def test_wheel_facts_find_every_keel_library_and_the_runtime_requirements(tmp_path):
    import zipfile

    wheel = tmp_path / "keel-0-cp310-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("keel/_C.abi3.so", b"one")
        zf.writestr("keel/vendored/deep_gemm/_C.abi3.so", b"two")
        zf.writestr("keel/__init__.py", b"")
        zf.writestr(
            "keel-0.dist-info/METADATA",
            'Name: keel\nRequires-Dist: numpy\nRequires-Dist: torch>=2.10\nRequires-Dist: pytest; extra == "test"\n',
        )
    libs, requires = pipeline.wheel_facts(wheel)
    assert libs == {
        "_C.abi3.so": hashlib.sha256(b"one").hexdigest(),
        "vendored/deep_gemm/_C.abi3.so": hashlib.sha256(b"two").hexdigest(),
    }
    assert requires == ["numpy"]


def test_a_torch_pip_cannot_install_is_a_clear_error(tmp_path):
    # a real pip failure without network: no index, an empty find-links folder
    (tmp_path / "empty").mkdir()
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "empty"), "PIP_CONSTRAINT": "/dev/null"}
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "torch==2.99.0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.returncode != 0
    err = pipeline.torch_install_error("2.99.0", sys.executable, proc.stdout, tmp_path / "log")
    assert re.search(r"torch==2\.99\.0 cannot be installed for Python \d\.\d+: ERROR: .*torch==2\.99\.0", str(err))
    assert "pip index versions torch" in str(err) and "--targets" in str(err)
    # a full disk is not a missing release: the advice says to free space, not to pick another torch
    full = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device\n"
    err = pipeline.torch_install_error("2.9.1", sys.executable, full, tmp_path / "log")
    assert "Free disk space" in str(err) and "--targets" not in str(err)


def test_table_marks_different_tokens():
    same = pipeline.Row(
        "2.13.0",
        "2.14.1",
        "3.11",
        "e",
        libraries_same=True,
        libraries="yes (1/1 mapped)",
        op_tests="9 passed, 0 skipped",
        op_tests_ok=True,
        tok_s=1.0,
        ttft_ms=2.0,
        token_ids=[1, 2],
        tokens_same=True,
    )
    other = pipeline.Row(**{**same.__dict__, "torch_b": "2.15.0", "token_ids": [1, 3], "tokens_same": False})
    text = pipeline.table([same, other], "STABLE", "2.10")
    assert "| 2.14.1 | 3.11 | yes (1/1 mapped) | STABLE, torch>=2.10 |" in text and "| yes (2) |" in text
    assert "| NO (2) |" in text
    assert same.ok and not other.ok


def test_pipeline_help_runs_without_torch():
    proc = subprocess.run(
        [sys.executable, "-S", str(ROOT / "scripts" / "pipeline.py"), "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert proc.returncode == 0 and "--targets" in proc.stdout, proc.stderr


def _third_party_imports(paths: list[Path]) -> set[str]:
    """Top-level modules imported by these test files (and the conftest / support code they use)."""
    import ast

    local = {p.stem for p in (ROOT / "tests").rglob("*.py")} | {
        p.name for p in (ROOT / "tests").rglob("*") if p.is_dir()
    }
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            )
            found.update(n.split(".")[0] for n in names)
    return {m for m in found - local - set(sys.stdlib_module_names) if m != "keel"}


def test_target_environments_install_what_the_op_tests_import():
    """A target environment has torch, the wheel and TEST_TOOLS; the op tests must import nothing else
    (tests/test_wheel_libraries.py imports keel_audit: a target env without it fails collection)."""
    files = [ROOT / "tests" / "conftest.py", *sorted((ROOT / "tests" / "support").rglob("*.py"))]
    for entry in pipeline.OP_TESTS:
        target = ROOT / entry
        files += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    provided = {"torch"} | {{"pytest": "pytest", str(ROOT / "audit"): "keel_audit"}[t] for t in pipeline.TEST_TOOLS}
    assert _third_party_imports(files) <= provided
    ci = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    install = re.search(r'pip install "torch==\$\{TORCH\}"(.*)', ci)
    assert install and set(install.group(1).split()) >= {"pytest", "./audit"}
    assert " ".join(pipeline.OP_TESTS) in ci  # the matrix runs the same op tests


def test_build_env_gets_the_runtime_requirements_before_fetch_demo(tmp_path, monkeypatch):
    """The wheel goes into torch A's environment without dependencies; on a fresh machine that
    environment has no numpy, so `keel models fetch-demo` failed until the requirements went in first."""
    import zipfile

    wheel = tmp_path / "keel-0-cp310-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("keel/_C.abi3.so", b"one")
        zf.writestr("keel-0.dist-info/METADATA", "Name: keel\nRequires-Dist: numpy\nRequires-Dist: torch>=2.10\n")
    calls: list[str] = []
    monkeypatch.setattr(pipeline, "LOGS", tmp_path / "logs")
    monkeypatch.setattr(pipeline, "build", lambda *a: wheel)
    monkeypatch.setattr(pipeline, "check_build_tree", lambda built: None)
    monkeypatch.setattr(pipeline, "installed_torch", lambda env: "2.13.0")
    monkeypatch.setattr(pipeline, "audit", lambda *a: ("STABLE", "2.10"))
    monkeypatch.setattr(pipeline, "run", lambda cmd, log, **kw: calls.append(" ".join(map(str, cmd))))
    monkeypatch.setattr(pipeline, "run_row", lambda row, *a, **kw: calls.append("row") or row)
    pipeline.main(["--targets", "2.14.1", "--below-floor", "", "--build-env", str(tmp_path / "venv")])
    fetch = next(i for i, c in enumerate(calls) if "models fetch-demo" in c)
    deps = [i for i, c in enumerate(calls) if "pip install" in c and " numpy " in f"{c} "]
    assert deps and deps[0] < fetch, calls
