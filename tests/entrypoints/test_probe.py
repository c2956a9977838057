"""The project's own probe (benchmarks/probe/serve.py) on a sample of its hostile cases, and a bounded
schemathesis pass over keel serve's OpenAPI document (fixed seed, small example count): 0 failures."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.native import needs_ops

pytestmark = needs_ops

ROOT = Path(__file__).resolve().parents[2]
TINY_ARGS = ["--device", "cpu", "--dtype", "fp32", "--block-size", "4", "--kv-cache-gib", "0.05"]


@pytest.mark.slow  # starts its own keel serve and runs every category of the probe
def test_probe_sample_has_no_crash_no_5xx_no_unexpected_answer(tiny_model, tmp_path):
    out = tmp_path / "probe.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "probe" / "serve.py"), "--model", str(tiny_model), "--sample"]
    for category in ("grammars", "templates", "Unicode", "API key", "malformed", "untrusted", "agents"):
        cmd += ["--only", category]
    done = subprocess.run([*cmd, "--json", str(out), "--", *TINY_ARGS], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["alive"] and report["exit"] == 0 and len(report["results"]) == 7
    for r in report["results"]:
        assert r["cases"] > 0 and r["crashes"] == 0 and r["server_errors"] == 0 and not r["unexpected"], r


@pytest.mark.slow  # its own keel serve, a few seconds of each attack
def test_untrusted_probe_runs_and_its_answers_and_memory_goals_hold(tiny_model, tmp_path):
    """Its grammar scenarios: the attacks' answers (4xx, the small grammar's 200) and the server's RSS (the
    latency scenarios are the benchmark's to report: a loaded test machine says nothing about them)."""
    out = tmp_path / "untrusted.json"
    script = ROOT / "benchmarks" / "probe" / "untrusted.py"
    cmd = [sys.executable, str(script), "--model", str(tiny_model), "--quick", "--only", "grammars"]
    done = subprocess.run([*cmd, "--json", str(out), "--", *TINY_ARGS], capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    assert report["alive"] and report["exit"] == 0, done.stderr[-3000:]
    checked = [r for r in report["rows"] if "status" in r["measure"] or "server RSS" in r["measure"]]
    assert len(checked) == 5 and all(r["met"] for r in checked), checked


@pytest.mark.slow  # a property-based pass over the whole OpenAPI document (capped at 15 s)
def test_schemathesis_finds_no_failure(served, tmp_path):
    st = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    if st is None:
        pytest.skip("schemathesis is not installed (requirements-test.txt)")
    cmd = [st, "run", served.base_url + "/openapi.json", "--max-examples", "5", "--seed", "26", "--workers", "1"]
    cmd += ["--phases", "examples,fuzzing", "--request-timeout", "30", "--max-time", "15"]
    cmd += [
        "--checks",
        "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "unique failure" not in done.stdout
