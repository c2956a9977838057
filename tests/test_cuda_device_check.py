"""scripts/device_check.sh without a GPU: its dry run (every step that needs none) passes on the wheel this suite
tests, and its summary logic fails what a GPU run must fail (a CUDA path that ran no test, a failed test or step).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from device_check_paths import CUDA_PATHS, classify  # noqa: E402

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
def test_dry_run_passes_and_checks_every_cuda_path(tmp_path):
    devpkgs = tmp_path / "devpkgs" / "wheels"
    devpkgs.mkdir(parents=True)
    _wheel(devpkgs, "keel_devcheck_probe", "1.0")  # missing here: unpacked into the prefix
    _wheel(devpkgs, "pytest", "0.0.1")  # older than the installed one: never shadows it
    out = tmp_path / "out"
    env = {**os.environ, "PY": sys.executable, "OUT": str(out)}
    cmd = ["bash", str(ROOT / "scripts" / "device_check.sh"), "--dry-run", "--wheel", str(WHEELS[-1])]
    proc = subprocess.run(
        cmd + ["--devpkgs", str(devpkgs.parent)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["result"] == "PASSED" and summary["mode"] == "dry"
    assert [s["step"] for s in summary["steps"]] == [
        "env", "deps", "audit", "install", "import", "tests", "bench_gemm", "bench_attention", "bench_ops",
    ]  # fmt: skip
    assert all(s["rc"] == 0 for s in summary["steps"])
    assert len(summary["paths"]) == len(CUDA_PATHS)
    assert all(p["status"] == "skipped (no GPU)" and p["skipped"] > 0 for p in summary["paths"]), summary["paths"]
    assert summary["tests"]["passed"] == 0 and summary["tests"]["skipped"] > 500
    imported = json.loads((out / "import.json").read_text())
    assert imported["from_prefix"] and not imported["sys_path_has_checkout"], imported
    deps_log = (out / "logs" / "deps.log").read_text()
    assert "unpacked keel_devcheck_probe-1.0" in deps_log and "skip pytest-0.0.1" in deps_log, deps_log
    assert (out / "summary.md").read_text().startswith("# keel device check (CPU dry run: no CUDA path ran)")
    bench = json.loads((out / "bench_gemm.json").read_text())
    assert bench["dry_run"] and all(v.startswith("dry run") for v in bench["figures"].values())


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


def test_summary_exit_status(tmp_path):
    import device_check

    cases = _cases({})
    junit = "".join(f'<testcase classname="{c["id"].split("::")[0]}" name="{c["id"].split("::")[1]}"/>' for c in cases)
    (tmp_path / "junit.xml").write_text(f"<testsuites><testsuite>{junit}</testsuite></testsuites>")
    (tmp_path / "steps.tsv").write_text("env\t0\t1\t\ntests\t0\t5\t\n")
    assert device_check.cmd_summary(str(tmp_path), "gpu") == 0
    assert json.loads((tmp_path / "summary.json").read_text())["result"] == "PASSED"
    (tmp_path / "steps.tsv").write_text("env\t0\t1\t\nbench_ops\t1\t5\t\n")
    assert device_check.cmd_summary(str(tmp_path), "gpu") == 1
    assert "step bench_ops exited 1" in json.loads((tmp_path / "summary.json").read_text())["failures"]
