"""scripts/release/pipeline.py and its probe: what they prove can fail (the full run is `bash scripts/demo.sh`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


pipeline = load_script("scripts/release/pipeline.py", "pipeline_checks")
checks = sys.modules[pipeline.Row.__module__]  # scripts/release/pipeline_checks.py, as pipeline.py imported it


def test_probe_hashes_what_the_process_mapped_not_what_lies_on_disk(tmp_path):
    """One child: keel loaded, then its probe asked about keel's folder and about a copy of _C."""
    script = (
        "import json, runpy, shutil, sys, torch; from pathlib import Path; import keel\n"
        "d = Path(keel.__file__).resolve().parent\n"
        "shutil.copy(d / '_C.abi3.so', sys.argv[1])  # the same bytes, never mapped\n"
        f"probe = runpy.run_path({str(ROOT / 'scripts' / 'release' / 'demo_generate.py')!r}, run_name='probe')\n"
        "m = probe['mapped_keel_libraries']\n"
        "print(json.dumps({'dir': str(d), 'mapped': m(d), 'copy': m(Path(sys.argv[1]).parent),\n"
        "                  'cuda_torch': bool(torch.version.cuda)}))"
    )
    release = str(ROOT / "scripts" / "release")  # the probe imports demo_ops from its folder
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (release, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "_C.abi3.so")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
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
    assert pipeline.compare_libraries(built, {"_C.abi3.so": "a" * 64}, str(ROOT / "src" / "keel"), env)[0] is False


def test_wheel_facts_find_every_keel_library_and_the_runtime_requirements(tmp_path):
    import zipfile

    wheel = tmp_path / "keel-0-cp310-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("keel/_C.abi3.so", b"one")
        zf.writestr("keel/vendored/deep_gemm/_C.abi3.so", b"two")
        zf.writestr("src/keel/__init__.py", b"")
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


def _row(**kw):
    base = dict(libraries_same=True, libraries="yes (1/1 mapped)", op_tests="9 passed, 0 skipped", op_tests_ok=True)
    base |= dict(test_counts={"keel": [5, 0, 1], "deep_gemm": [3, 0, 0], "flash_attn": [4, 0, 2]}, tok_s=1.0)
    base |= dict(torch_a="2.13.0", torch_b="2.14.1", python="3.11", env="e", ttft_ms=2.0)
    return pipeline.Row(**(base | kw))


def test_rows_hold_logits_and_tokens_to_torch_a():
    """Tokens count up to A's first near-tie; logits on A's tokens must stay within LOGIT_ATOL."""
    ref = {"token_ids": [1, 2, 3, 4], "margins": [5.0, 5.0, 0.125, 5.0]}  # A's near-tie at token 2
    same_logits = {"reference": {"max_abs": 0.0, "mean_abs": 0.0, "positions": 40}, "token_ids": []}
    rows = {}
    for name, tokens, result in [
        ("equal", [1, 2, 3, 4], same_logits),
        ("after the tie", [1, 2, 9, 9], same_logits),
        ("before the tie", [1, 9, 3, 4], same_logits),
        ("logits off", [1, 2, 3, 4], {"reference": {"max_abs": 0.5, "mean_abs": 0.01, "positions": 40}}),
        ("not compared", [1, 2, 3, 4], {"reference": None}),
    ]:
        row = _row(token_ids=tokens)
        checks.check_probe_ops(
            row, [{"op": "x", "device": "cpu", "dtype": "float32", "rel": 0.0, "bound": 1e-5, "ok": True}]
        )
        checks.compare_to_reference(row, result, ref)
        rows[name] = row
    assert (
        rows["equal"].ok
        and "yes: 4/4 equal; must be equal: those before A's first margin < 0.5: token 2 (0.125)"
        in rows["equal"].tokens
    )
    assert rows["after the tie"].ok and "yes: 2/4 equal" in rows["after the tie"].tokens
    assert not rows["before the tie"].ok and "NO: 1/4 equal" in rows["before the tie"].tokens
    assert not rows["logits off"].ok and "> 0.25" in rows["logits off"].logits
    assert not rows["not compared"].ok and "NOT compared" in rows["not compared"].logits
    a = _row(torch_b="2.13.0", token_ids=[1, 2, 3, 4])
    checks.check_probe_ops(a, [{"op": "x", "device": "cpu", "dtype": "float32", "rel": 0.0, "bound": 1e-5, "ok": True}])
    checks.compare_to_reference(a, {"token_ids": [1, 2, 3, 4]}, None)  # torch A is its own reference
    assert a.ok and a.tokens == "(reference: 4 tokens)"
    text = pipeline.table([a, *rows.values()], "STABLE", "2.10")
    assert "| keel tests p / f / s | deep_gemm tests p / f / s | flash_attn tests p / f / s |" in text
    assert "| STABLE, torch>=2.10 | 5 / 0 / 1 | 3 / 0 / 0 | 4 / 0 / 2 | - |" in text  # no vendored-loader count


def test_probe_ops_beyond_their_bound_fail_the_row():
    row = _row()
    ok = {"op": "rms_norm", "device": "cpu", "dtype": "bfloat16", "rel": 4e-3, "bound": 1e-2, "ok": True}
    bad = {
        "op": "deep_gemm.fp8_gemm_nt vs unquantized",
        "device": "cpu",
        "dtype": "bfloat16",
        "rel": 0.2,
        "bound": 0.08,
    }
    checks.check_probe_ops(row, [ok, {**bad, "ok": False}])
    assert row.probe_ops_ok is False and row.probe_ops.startswith("1/2 within bounds; EXCEEDED: deep_gemm")
    checks.check_probe_ops(row, [])  # a probe that checked nothing does not pass
    assert row.probe_ops_ok is False


def test_op_tests_are_counted_per_library(tmp_path):
    junit = tmp_path / "j.xml"
    cases = [
        ("tests.ops.test_rms_norm", ""),
        ("tests.test_native", "<skipped/>"),
        ("tests.vendored.deep_gemm.test_gemm", ""),
        ("tests.vendored.deep_gemm.test_gemm", "<failure/>"),
        ("tests.vendored.flash_attn.test_ops", "<error/>"),
        ("tests.vendored.flash_attn.test_ops", "<skipped/>"),
        ("tests.vendored.test_loader", ""),
    ]
    body = "".join(f'<testcase classname="{c}" name="t{i}">{x}</testcase>' for i, (c, x) in enumerate(cases))
    junit.write_text(f'<testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    assert pipeline.count_tests(junit) == {
        "keel": [1, 0, 1],
        "deep_gemm": [1, 1, 0],
        "flash_attn": [0, 1, 1],
        "vendored loader": [1, 0, 0],
    }
    assert "tests/vendored" in pipeline.OP_TESTS


def test_demo_ops_bounds_catch_a_wrong_fp8_gemm(monkeypatch):
    """Every op of the installed wheel is within its bound; an FP8 GEMM 20% off is not."""
    demo_ops = load_script("scripts/release/demo_ops.py")
    from keel.vendored import deep_gemm as dg

    assert all(c.ok for c in demo_ops.checks()), demo_ops.table(demo_ops.checks())
    real = dg.fp8_gemm_nt

    def off(a, b, d, *args, **kw):
        real(a, b, d, *args, **kw)
        d.mul_(1.2)

    monkeypatch.setattr(dg, "fp8_gemm_nt", off)
    bad = [c.op for c in demo_ops.checks() if not c.ok]
    assert bad and all(op.startswith("deep_gemm.fp8_gemm_nt") for op in bad), bad


def test_pipeline_help_runs_without_torch():
    proc = subprocess.run(
        [sys.executable, "-S", str(ROOT / "scripts" / "release" / "pipeline.py"), "--help"],
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


def _support_modules(paths: list[Path]) -> list[Path]:
    """The tests/support modules these files import, and those they import in turn."""
    import ast

    found: list[Path] = []
    todo = list(paths)
    while todo:
        for node in ast.walk(ast.parse(todo.pop().read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("support."):
                path = ROOT / "tests" / (node.module.replace(".", "/") + ".py")
                if path not in found:
                    found.append(path)
                    todo.append(path)
    return found


def test_target_environments_install_what_the_op_tests_import():
    """A target environment has torch, the wheel and TEST_TOOLS; the op tests must import nothing else
    (tests/test_wheel_libraries.py imports keel_audit: a target env without it fails collection)."""
    files = [ROOT / "tests" / "conftest.py"]
    for entry in pipeline.OP_TESTS:
        target = ROOT / entry
        files += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    files += _support_modules(files)
    tools = {"pytest": "pytest", str(ROOT / "audit"): "keel_audit", str(ROOT / "dev"): "keel_dev"}
    provided = {"torch"} | {tools[t] for t in pipeline.TEST_TOOLS}
    assert _third_party_imports(files) <= provided
    ci = (ROOT / "scripts" / "release" / "wheel_on_torch.sh").read_text()  # ci.yml's matrix job
    install = re.search(r'pip install -c requirements-test.txt "torch==\$\{TORCH\}"(.*)', ci)
    assert install and set(install.group(1).split()) >= {"pytest", "./audit", "./dev"}
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
    monkeypatch.setattr(pipeline, "check_reproducible", lambda wheel, env: None)  # a second build: the main job's
    monkeypatch.setattr(pipeline, "installed_torch", lambda env: "2.13.0")
    monkeypatch.setattr(pipeline, "audit", lambda *a: ("STABLE", "2.10"))
    monkeypatch.setattr(pipeline, "run", lambda cmd, log, **kw: calls.append(" ".join(map(str, cmd))))
    monkeypatch.setattr(pipeline, "run_row", lambda row, *a, **kw: calls.append("row") or (row, None))
    pipeline.main(["--targets", "2.14.1", "--below-floor", "", "--build-env", str(tmp_path / "venv")])
    fetch = next(i for i, c in enumerate(calls) if "models fetch-demo" in c)
    deps = [i for i, c in enumerate(calls) if "pip install" in c and " numpy " in f"{c} "]
    assert deps and deps[0] < fetch, calls
