"""scripts/device/check.sh without a GPU: its dry run (every step that needs none) passes on the wheel this suite
tests, and its summary logic fails what a GPU run must fail (a CUDA path that ran no test, a failed test or step);
one area's pytest process records each verdict as it comes, and a sticky fault or a crash ends only that process:
the area resumes in a fresh one, and the summary names the failing test ids.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEVICE = ROOT / "scripts" / "device"


def _load(name: str) -> ModuleType:
    """scripts/device/<name>.py by file path (scripts/ is never put on sys.path)."""
    spec = importlib.util.spec_from_file_location(f"keel_device_{name}_under_test", DEVICE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


check = _load("check")
paths = _load("paths")
CUDA_PATHS, classify = paths.CUDA_PATHS, paths.classify

WHEELS = sorted((ROOT / "dist").glob("keel-*.whl"))


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel: one package, its dist-info."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", "PROBE = True\n")
        z.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(
            f"{name}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{name}-{version}.dist-info/RECORD", "")
    return path


@pytest.mark.skipif(not WHEELS, reason="no dist/keel-*.whl: scripts/test.sh builds it before the suite")
@pytest.mark.slow  # builds a prefix and runs every step that needs no GPU
def test_dry_run_passes_and_checks_every_cuda_path(tmp_path):
    devpkgs = tmp_path / "devpkgs" / "wheels"
    devpkgs.mkdir(parents=True)
    _wheel(devpkgs, "keel_devcheck_probe", "1.0")  # missing here: unpacked into the prefix
    _wheel(devpkgs, "pytest", "0.0.1")  # older than the installed one: never shadows it
    _wheel(devpkgs, "pytest", "999.0")  # newer: never shadows it either
    out = tmp_path / "out"
    env = {**os.environ, "PY": sys.executable, "OUT": str(out), "TMPDIR": str(tmp_path)}
    cmd = ["bash", str(DEVICE / "check.sh"), "--dry-run", "--wheel", str(WHEELS[-1])]
    proc = subprocess.run(
        cmd + ["--devpkgs", str(devpkgs.parent)], env=env, capture_output=True, text=True, timeout=1500
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "bench_attention.json", "bench_gemm.json", "bench_ops.json", "junit.xml", "logs.tar.gz", "summary.json",
        "summary.md",
    ]  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["result"] == "PASSED" and summary["mode"] == "dry"
    assert [s["step"] for s in summary["steps"]] == [
        "env", "deps", "audit", "install", "import", "tests_ops", "tests_deep_gemm", "tests_flash_attn",
        "tests_engine", "tests_server", "bench_gemm", "bench_attention", "bench_ops", "memcheck",
    ]  # fmt: skip
    assert all(s["rc"] == 0 for s in summary["steps"])
    assert sorted(summary["areas"]) == ["deep_gemm", "engine", "flash_attn", "ops", "server"]
    assert len(summary["paths"]) == len(CUDA_PATHS)
    assert all(p["status"] == "skipped (no GPU)" and p["skipped"] > 0 for p in summary["paths"]), summary["paths"]
    assert summary["tests"]["passed"] == 0 and summary["tests"]["skipped"] > 500
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = tar.getnames()
        imported = json.loads(tar.extractfile("import.json").read())
        deps_log = tar.extractfile("logs/deps.log").read().decode()
    assert "results/ops.jsonl" in names and "logs/steps.tsv" in names, names
    assert imported["from_prefix"] and not imported["sys_path_has_checkout"], imported
    assert "unpacked keel_devcheck_probe-1.0" in deps_log, deps_log
    assert "skip pytest-0.0.1" in deps_log and "skip pytest-999.0" in deps_log, deps_log
    assert (out / "summary.md").read_text().startswith("# keel device check (CPU dry run: no CUDA path ran)")
    bench = json.loads((out / "bench_gemm.json").read_text())
    assert bench["dry_run"] and bench["complete"] and all(v.startswith("dry run") for v in bench["figures"].values())
    junit = (out / "junit.xml").read_text()
    assert junit.count("<testsuite ") == 5, junit[:500]


def _cases(outcome_of: dict[str, str]) -> list[dict[str, str]]:
    """One junit case per CUDA path (a name its pattern matches), with the given outcome (default passed)."""
    ids = {
        "keel::fused_muladd": "tests.ops.test_cuda::test_fused_muladd[x]",
        "keel::rms_norm": "tests.ops.test_cuda::test_rms_norm[x]",
        "keel::fused_add_rms_norm": "tests.ops.test_cuda::test_fused_add_rms_norm[x]",
        "keel::rotary_embedding": "tests.ops.test_cuda::test_rotary_embedding[x]",
        "keel::silu_and_mul": "tests.ops.test_cuda::test_silu_and_mul[x]",
        "keel::reshape_and_cache": "tests.ops.test_cuda::test_reshape_and_cache_writes_exactly_the_slots[x]",
        "keel::linear (cuBLAS through the dispatcher)": "tests.ops.test_cuda::test_linear[x]",
        "keel ops: aliasing, streams, devices": "tests.ops.test_cuda::test_aliased_in_place_arguments_refused",
        "keel ops: device-side range checks": "tests.ops.test_cuda::test_device_check_bad_slot",
        "deep_gemm fp8_gemm_nt": "tests.vendored.deep_gemm.test_cuda::test_fp8_gemm_matches_cpu_and_reference[x]",
        "deep_gemm bf16_gemm_nt": "tests.vendored.deep_gemm.test_cuda::test_bf16_gemm_matches_reference",
        "deep_gemm casts (per-token, 1x128, 128x128)": "tests.vendored.deep_gemm.test_cuda::test_per_token_cast[x]",
        "flash_attn varlen": "tests.vendored.flash_attn.test_cuda::test_cuda_matches_reference_and_cpu[varlen-x]",
        "flash_attn paged varlen": "tests.vendored.flash_attn.test_cuda::test_cuda_matches_reference_and_cpu[paged-x]",
        "flash_attn kvcache paged (decode)": "tests.vendored.flash_attn.test_cuda::test_cuda_matches_reference_and_cpu[kv_paged-x]",
        "flash_attn kvcache dense": "tests.vendored.flash_attn.test_cuda::test_cuda_matches_reference_and_cpu[kv_dense-x]",
        "flash_attn num_splits, streams, host checks": "tests.vendored.flash_attn.test_cuda::test_host_checks",
        "flash_attn device-side checks": "tests.vendored.flash_attn.test_cuda::test_device_check_asserts[block]",
        "keel ops: non-finite input, rows past the grid, unaligned views": "tests.ops.test_cuda_nonfinite::test_x[y]",
        "deep_gemm: non-finite input": "tests.vendored.deep_gemm.test_cuda_nonfinite::test_x",
        "flash_attn: non-finite input (NaN as the CPU twin)": "tests.vendored.flash_attn.test_cuda_nonfinite::test_x",
        "engine on CUDA, bf16": "tests.engine.test_cuda_engine::test_random_smollm2_shapes_cuda_equals_cpu[bf16]",
        "engine on CUDA, fp8": "tests.engine.test_cuda_engine::test_random_smollm2_shapes_cuda_equals_cpu[fp8]",
        "keel serve --device cuda": "tests.entrypoints.test_cuda_serve::test_keel_serve_on_cuda_answers",
    }
    assert sorted(ids) == sorted(p.name for p in CUDA_PATHS)
    return [{"id": i, "outcome": outcome_of.get(name, "passed")} for name, i in ids.items()]


def test_each_path_matches_its_tests_only():
    rows = classify(_cases({}), {}, gpu=True)
    assert all(r["status"] == "passed" and r["ran"] == 1 for r in rows), [(r["path"], r["ran"]) for r in rows]


def test_gpu_run_fails_a_path_that_ran_no_test_or_failed():
    rows = {
        r["path"]: r for r in classify(_cases({"flash_attn varlen": "skipped", "keel::rms_norm": "failed"}), {}, True)
    }
    assert rows["flash_attn varlen"]["status"] == "not run"
    assert rows["keel::rms_norm"]["status"] == "failed"
    dry = {r["path"]: r for r in classify(_cases({"flash_attn varlen": "skipped"}), {}, False)}
    assert dry["flash_attn varlen"]["status"] == "skipped (no GPU)"
    assert classify([], {}, False)[0]["status"] == "not run"  # the dry run: a path without any test fails


def _nodeid(junit_id: str) -> str:
    path, _, name = junit_id.partition("::")
    return path.replace(".", "/") + ".py::" + name


def test_summary_exit_status_and_failing_ids(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "results").mkdir(parents=True)
    out.mkdir()
    rows = [{"nodeid": _nodeid(c["id"]), "outcome": c["outcome"]} for c in _cases({})]
    assert check.junit_id(rows[0]["nodeid"]) == _cases({})[0]["id"]
    (work / "results" / "ops.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "steps.tsv").write_text("env\t0\t1\t\ntests_ops\t0\t5\t\nmemcheck\t124\t40\ttimed out\n")
    assert check.cmd_summary(str(work), str(out), "gpu") == 0  # a time-boxed sanitizer timeout is a note
    assert json.loads((out / "summary.json").read_text())["result"] == "PASSED"
    (work / "steps.tsv").write_text("env\t0\t1\t\nbench_ops\t1\t5\t\n")
    assert check.cmd_summary(str(work), str(out), "gpu") == 1
    assert "step bench_ops exited 1" in json.loads((out / "summary.json").read_text())["failures"]
    # a test the process died in (its last row "started") is failed, and named with its id
    died = _nodeid("tests.ops.test_cuda::test_rms_norm[died]")
    with (work / "results" / "ops.jsonl").open("a") as f:
        f.write(json.dumps({"nodeid": died, "outcome": "started"}) + "\n")
    (work / "steps.tsv").write_text("env\t0\t1\t\n")
    assert check.cmd_summary(str(work), str(out), "gpu") == 1
    summary = json.loads((out / "summary.json").read_text())
    assert [t["id"] for t in summary["failed_tests"]] == ["tests.ops.test_cuda::test_rms_norm[died]"]
    assert "tests.ops.test_cuda::test_rms_norm[died]" in (out / "summary.md").read_text()


# one area: a fake test file whose second test ends its process the way a sticky CUDA fault does (an error that
# names a device-side assert), whose third crashes the interpreter, and whose fourth hangs in "native" code
AREA_TESTS = """
import os, time
def test_a(): pass
def test_b_sticky(): raise RuntimeError("CUDA error: device-side assert triggered")
def test_c_crash(): os._exit(7)
def test_d_hang(): time.sleep(1000) if os.environ.get("HANG") else None
def test_e_fails(): assert 1 == 2
def test_f(): pass
"""


@pytest.mark.slow  # pytest child processes that crash and hang on purpose
def test_area_resumes_after_a_sticky_fault_and_a_crash(tmp_path):
    (tmp_path / "test_area_fake.py").write_text(AREA_TESTS)
    env = {**os.environ, "PYTHONPATH": str(DEVICE)}
    cmd = [sys.executable, str(DEVICE / "check.py"), "area", "fake", str(tmp_path / "work"), "120", "30", "--"]
    proc = subprocess.run(
        cmd + ["-p", "no:randomly", str(tmp_path / "test_area_fake.py")], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = check._results(tmp_path / "work" / "results" / "fake.jsonl")
    outcome = {k.split("::")[1]: v["outcome"] for k, v in rows.items()}
    assert outcome == {
        "test_a": "passed", "test_b_sticky": "failed", "test_c_crash": "failed", "test_d_hang": "passed",
        "test_e_fails": "failed", "test_f": "passed",
    }, (outcome, proc.stdout)  # fmt: skip
    assert rows[next(k for k in rows if "sticky" in k)].get("sticky")
    assert proc.stdout.count("run ") == 3, proc.stdout  # the first run, after the sticky fault, after the crash
    assert len(list((tmp_path / "work" / "junit").glob("fake-*.xml"))) == 2  # the crashed process wrote none


@pytest.mark.slow  # pytest child processes that crash and hang on purpose
def test_area_per_test_timeout(tmp_path):
    (tmp_path / "test_area_fake.py").write_text(AREA_TESTS)
    env = {**os.environ, "PYTHONPATH": str(DEVICE), "HANG": "1"}
    cmd = [sys.executable, str(DEVICE / "check.py"), "area", "hang", str(tmp_path / "work"), "120", "2", "--"]
    proc = subprocess.run(
        cmd + [str(tmp_path / "test_area_fake.py"), "-k", "hang or test_f"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    rows = check._results(tmp_path / "work" / "results" / "hang.jsonl")
    outcome = {k.split("::")[1]: v["outcome"] for k, v in rows.items()}
    assert outcome == {"test_d_hang": "failed", "test_f": "passed"}, (outcome, proc.stdout + proc.stderr)
    assert "per-test timeout" in rows[next(k for k in rows if "hang" in k)]["message"]
