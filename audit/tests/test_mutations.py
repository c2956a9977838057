"""Damaged real ELF libraries (truncated, flipped bytes, smashed headers, section and dynamic tables,
symbol and version tables, damaged wheel zips) each get a verdict or exit 2 with a message naming
the file: never a traceback, never a hang. A small sample here; audit/scripts/mutate_elf.py runs
the full harness over real wheels (README, "Auditing a wheel")."""

from __future__ import annotations

from pathlib import Path

import pytest
from audit_support import SYSTEM_LIB_DIR, interpreter_extensions, load_script, torch_library

harness = load_script("mutate_elf")
CASES = 64  # 4 libraries x (12 ELF mutations as files + 15 as wheel members, zip damage included), in part


def _samples() -> list[Path]:
    """Small real ELF objects of this machine that nobody here wrote, chosen alike on every run."""
    found = [p for p in interpreter_extensions() if p.name.startswith(("_json.", "_struct.", "_bisect."))]
    found += [p for p in (SYSTEM_LIB_DIR / "libz.so.1", torch_library("libtorch_global_deps.so")) if p and p.is_file()]
    return found[:4]


def test_mutated_real_libraries_get_a_verdict_or_a_clear_error(tmp_path: Path) -> None:
    samples = _samples()
    if not samples:
        pytest.skip("no real ELF libraries on this machine (no lib-dynload extensions, no libz)")
    libs = harness.libraries(samples, 8 << 20)
    outcomes = harness.run(libs, CASES, seed=7, timeout=20.0, jobs=1, in_process=True, work=tmp_path)
    kinds = {o.kind for o in outcomes}
    assert not kinds & set(harness.FAILURES), harness.report(outcomes)
    assert {"verdict", "error"} <= kinds, harness.report(outcomes)  # the sample damages and spares
    assert {o.mutation for o in outcomes} >= set(harness.MUTATIONS), harness.report(outcomes)


def test_one_case_in_a_fresh_process(tmp_path: Path) -> None:
    """The subprocess mode (the full run's) on a truncated and a header-smashed library."""
    samples = _samples()
    if not samples:
        pytest.skip("no real ELF libraries on this machine")
    lib = harness.libraries(samples[:1], 8 << 20)
    outcomes = harness.run(lib, 2, seed=3, timeout=60.0, jobs=1, in_process=False, work=tmp_path)
    assert [o.kind for o in outcomes if o.kind in harness.FAILURES] == [], harness.report(outcomes)


@pytest.mark.parametrize(
    "code,out,err,kind",
    [
        (0, '{"schema": "keel-audit/2", "exit_code": 0, "verdict": "STABLE"}', "", "verdict"),
        (2, "", "keel audit: error: x.so: 1 of 1 ELF object(s) could not be read", "error"),
        (2, "", "keel audit: error: some libraries could not be read", "unclear"),  # names no file
        (2, "", 'Traceback (most recent call last):\n  File "x"\nIndexError', "traceback"),
        (1, "not json", "", "unclear"),
        (-11, "", "", "unclear"),
        (0, '{"schema": "keel-audit/2", "exit_code": 0, "libraries": [{"path": "x.so"}]}', "", "verdict"),
        (0, '{"schema": "keel-audit/2", "exit_code": 0, "libraries": []}', "", "unclear"),  # x.so left out
    ],
)
def test_judge_tells_outcomes_apart(code: int, out: str, err: str, kind: str) -> None:
    listed = "x.so" if '"libraries"' in out else None
    assert harness.judge(Path("/tmp/x.so"), code, out, err, listed)[0] == kind


def test_a_case_past_its_timeout_is_a_hang(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import time

    import keel_audit.cli

    monkeypatch.setattr(keel_audit.cli, "main", lambda argv: time.sleep(30))
    start = time.monotonic()
    assert harness.run_in_process(tmp_path / "x.so", 0.2)[0] is None
    assert time.monotonic() - start < 5
