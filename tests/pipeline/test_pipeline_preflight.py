"""The pipeline's preflight column: `keel-audit preflight` of the wheel against torch B's .whl, read
before B is installed, must equal what the probe process mapped."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


pipeline = load_script("scripts/release/pipeline.py", "pipeline_checks")
checks = sys.modules[pipeline.Row.__module__]
BUILT = ["_C.abi3.so", "_C_cuda.abi3.so", "vendored/deep_gemm/_C.abi3.so", "vendored/deep_gemm/_C_cuda.abi3.so"]


def row(**kw):
    return pipeline.Row("2.13.0", "2.14.1", "3.11", "env", **kw)


def test_prediction_equal_to_what_was_mapped_passes():
    r = row(predicted={lib: "cuda" not in lib for lib in BUILT})
    checks.check_preflight(r, BUILT, ["_C.abi3.so", "vendored/deep_gemm/_C.abi3.so"])
    assert r.preflight_ok and r.preflight.startswith("yes (2/4 predicted to load")


def test_a_library_predicted_to_load_but_not_mapped_fails_the_row():
    r = row(
        predicted=dict.fromkeys(BUILT, True),
        libraries_same=True,
        op_tests_ok=True,
        probe_ops_ok=True,
        logits_ok=True,
        tokens_same=True,
    )
    checks.check_preflight(r, BUILT, ["_C.abi3.so", "vendored/deep_gemm/_C.abi3.so"])
    assert r.preflight_ok is False and not r.ok
    assert "_C_cuda.abi3.so: predicted loads, not mapped" in r.preflight


def test_a_library_predicted_not_to_load_but_mapped_fails_too():
    r = row(predicted={lib: False for lib in BUILT})
    checks.check_preflight(r, BUILT, ["_C.abi3.so"])
    assert r.preflight_ok is False and "_C.abi3.so: predicted does not load, mapped" in r.preflight


def test_no_prediction_leaves_the_row_to_its_other_checks():
    r = row(libraries_same=True, op_tests_ok=True, probe_ops_ok=True, logits_ok=True, tokens_same=True)
    checks.check_preflight(r, BUILT, ["_C.abi3.so"])
    assert r.preflight_ok is None and r.ok


def test_table_shows_the_preflight_column():
    r = row(
        predicted={lib: "cuda" not in lib for lib in BUILT},
        libraries_same=True,
        libraries="yes (2/2 mapped)",
        tok_s=50.0,
        ttft_ms=20.0,
    )
    checks.check_preflight(r, BUILT, ["_C.abi3.so", "vendored/deep_gemm/_C.abi3.so"])
    text = checks.table([r], "STABLE", "2.10")
    head, _sep, line = text.splitlines()
    cells = [c.strip() for c in line.split("|")]
    assert "preflight predicted = observed" in head.split("|")[5]
    assert cells[5].startswith("yes (2/4 predicted to load")


def test_preflight_reads_keel_audits_json(tmp_path, monkeypatch):
    doc = {
        "libraries": [{"path": "keel/_C.abi3.so", "loads": True}, {"path": "keel/_C_cuda.abi3.so", "loads": False}],
        "seconds": 1.5,
    }

    class Done:
        stdout = "some log line\n" + json.dumps(doc)
        returncode = 1

    calls = []
    monkeypatch.setattr(pipeline, "run", lambda cmd, log, **kw: calls.append(cmd) or Done())
    predicted, why = pipeline.preflight(tmp_path, tmp_path / "keel.whl", "/w/torch-2.14.1.whl", "t")
    assert predicted == {"_C.abi3.so": True, "_C_cuda.abi3.so": False} and why == ""
    assert calls[0][1:] == ["preflight", str(tmp_path / "keel.whl"), "--torch", "/w/torch-2.14.1.whl", "--json"]
    Done.stdout = "keel-audit preflight: error: --torch x: expected a torch .whl"
    predicted, why = pipeline.preflight(tmp_path, tmp_path / "keel.whl", "x", "t")
    assert predicted == {} and why.startswith("could not run: keel-audit preflight: error")
