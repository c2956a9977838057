"""`keel doctor`: the report on this environment, each failure it must catch (with its fix), and the
run by path that works when `import keel` itself fails."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from keel_dev.forked import run_python, run_script

from keel.cli import doctor


@pytest.fixture(scope="module")
def real() -> doctor.Report:
    return doctor.gather()


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks that start interpreters (the preflight, the CPU ISA question) answered at once:
    the tests that use this one change a single input of the verdict."""
    monkeypatch.setattr(doctor, "_preflight", lambda keel_dir, report: {})
    monkeypatch.setattr(doctor, "_cpu_isa", lambda report: "avx512")


def test_this_environment_works(real: doctor.Report) -> None:
    """keel's CPU libraries load on the test torch; the report names torch and keel as they are."""
    assert real.ok, real.problems
    assert real.torch_version == torch.__version__ and real.torch_cuda == torch.version.cuda
    cpu = [lib for lib in real.libraries if lib.kind == "CPU"]
    assert {lib.path for lib in cpu} >= {"keel/_C.abi3.so"}
    assert all(lib.loads for lib in cpu)
    if not torch.version.cuda:
        twins = [lib for lib in real.libraries if lib.kind == "CUDA twin"]
        assert twins and all(lib.loads is None and "CPU-only" in lib.note for lib in twins)
    text = doctor.render(real)
    assert "verdict: keel will work here" in text and f"torch {torch.__version__}" in text
    assert "model cache (keel)" in text


def test_preflight_agrees_with_the_load_check(real: doctor.Report) -> None:
    pytest.importorskip("keel_audit")
    for lib in real.libraries:
        if lib.loads is not None:
            assert lib.predicted is not None and lib.predicted.startswith("loads") == lib.loads, lib


def test_torch_below_the_floor_is_a_problem_with_its_fix(monkeypatch: pytest.MonkeyPatch, quick: None) -> None:
    monkeypatch.setattr(doctor, "_floor", lambda: (99, 1))
    report = doctor.gather(load=False)
    assert not report.ok
    assert any(
        "older than keel's floor 99.1" in what and fix == "pip install 'torch>=99.1'" for what, fix in report.problems
    )
    assert "verdict: keel will NOT work here" in doctor.render(report)


def test_a_cpu_library_that_does_not_load_fails_the_doctor(monkeypatch: pytest.MonkeyPatch, quick: None) -> None:
    def fake(paths: list[Path]) -> dict[str, tuple[bool, str]]:
        return {
            str(p): (not p.name == "_C.abi3.so" or "vendored" in str(p), "undefined symbol: torch_x") for p in paths
        }

    monkeypatch.setattr(doctor, "_load_all", fake)
    report = doctor.gather()
    assert not report.ok
    assert any(
        "keel/_C.abi3.so does not load" in what and "undefined symbol: torch_x" in what for what, _ in report.problems
    )


def test_cuda_torch_without_a_driver_is_a_warning(monkeypatch: pytest.MonkeyPatch, quick: None) -> None:
    """A CUDA torch on a machine with no driver: keel works on the CPU; it says why the GPU is unused."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(doctor, "_driver", lambda: (None, "no NVIDIA driver (libcuda.so.1 not found)"))
    monkeypatch.setattr(doctor, "_load_all", lambda paths: {str(p): (True, "") for p in paths})
    report = doctor.gather()
    assert report.ok and any("no NVIDIA driver" in w for w in report.warnings)


def test_driver_older_than_the_static_runtime(monkeypatch: pytest.MonkeyPatch, quick: None) -> None:
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(doctor, "_driver", lambda: ((12, 4), ""))
    monkeypatch.setattr(doctor, "_twin_cuda", lambda paths: (13, 0))
    monkeypatch.setattr(doctor, "_load_all", lambda paths: {str(p): (True, "") for p in paths})
    report = doctor.gather()
    assert not report.ok
    assert any("driver supports CUDA 12.4, older than the CUDA 13.0" in what for what, _ in report.problems)
    monkeypatch.setattr(doctor, "_driver", lambda: ((13, 1), ""))
    assert doctor.gather().ok


def test_twin_cuda_release_is_read_from_the_library(tmp_path: Path) -> None:
    lib = tmp_path / "_C_cuda.abi3.so"
    lib.write_bytes(b"\x7fELF....Cuda compilation tools, release 12.8, V12.8.93\0")
    assert doctor._twin_cuda([lib]) == (12, 8)


def test_runs_by_path_without_importing_keel() -> None:
    """The file alone (what the README says to run when `import keel` fails) imports no keel module."""
    code = (
        "import runpy, sys; sys.argv = ['doctor.py', '--json', '--no-load']\n"
        f"try:\n    runpy.run_path({doctor.__file__!r}, run_name='__main__')\n"
        "except SystemExit as e:\n    pass\n"
        "assert not [m for m in sys.modules if m == 'keel' or m.startswith('keel.')], 'keel imported'\n"
    )
    done = run_python(code, cwd="/", timeout=300)  # a child that has not imported keel, as `python -c`
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["torch_version"] == torch.__version__


def test_cli_verb_exit_code(capsys: pytest.CaptureFixture[str], quick: None) -> None:
    from keel.cli import main

    assert main(["doctor", "--no-load", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["keel_version"]


def _by_path(env: dict[str, str]) -> dict:
    done = run_script(doctor.__file__, "--json", "--no-load", cwd="/", env=env, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def test_by_path_reads_keels_one_floor_and_isa_levels() -> None:
    """Run by path, doctor loads src/keel/_settings.py by file: the floor and the KEEL_CPU_ISA check are keel's own."""
    from keel import _settings

    env = {k: v for k, v in os.environ.items() if k != "KEEL_CPU_ISA"}
    assert tuple(_by_path(env)["torch_floor"]) == _settings.torch_floor()
    bad = _by_path({**env, "KEEL_CPU_ISA": "avx9000"})
    assert bad["ok"] is False
    assert any(
        "KEEL_CPU_ISA='avx9000'" in what
        and fix == "unset KEEL_CPU_ISA or set it to one of auto, base, avx2, avx512, amx"
        for what, fix in bad["problems"]
    ), bad["problems"]


def test_isa_line_is_the_librarys_own_answer(real: doctor.Report) -> None:
    """The ISA line says what keel's library reports (keel._native.cpu_isa_status): its build and AMX state."""
    from keel._native import cpu_isa_status
    from keel.vendored.flash_attn import cpu_isa

    status = cpu_isa_status()
    amx = "AMX" if status.amx else f"no AMX ({status.amx_reason})"
    level = status.level
    want = f"{status.build}; bf16/FP8 prompt GEMMs: {amx}; vendored flash_attn: {cpu_isa()}"
    assert real.cpu_isa == want + (f" (KEEL_CPU_ISA={level})" if level != "auto" else ""), real.cpu_isa
    assert doctor._amx_state() == amx


def test_huge_pages_line_and_an_unknown_switch(quick, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host-memory line says what the engine will do with this kernel's THP mode and KEEL_HUGE_PAGES; an
    unknown KEEL_HUGE_PAGES is a problem with its fix (the engine refuses to start on it)."""
    from keel import _settings

    monkeypatch.delenv("KEEL_HUGE_PAGES", raising=False)
    mode = _settings.thp_mode()
    line = doctor.gather(load=False).huge_pages
    if _settings.huge_pages_available():
        assert line == f"CPU weights and K/V pools on transparent huge pages (kernel THP mode {mode})"
    else:
        assert line.startswith("base pages (no transparent huge pages") and mode in line
    monkeypatch.setenv("KEEL_HUGE_PAGES", "off")
    assert doctor.gather(load=False).huge_pages.startswith("base pages (KEEL_HUGE_PAGES turns huge pages off")
    monkeypatch.setenv("KEEL_HUGE_PAGES", "lots")
    bad = doctor.gather(load=False)
    assert not bad.ok and "host memory: KEEL_HUGE_PAGES not understood" in doctor.render(bad)
    assert ("keel: KEEL_HUGE_PAGES='lots' is not a known setting; expected 0 / off or 1 / on / auto",
            "unset KEEL_HUGE_PAGES or set it to 0 / off or 1 / on / auto") in bad.problems  # fmt: skip
