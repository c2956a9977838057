"""An AVX2-only CPU, emulated: the ISA test, the compatibility tests and `keel generate` run in processes on
qemu-user's Haswell model (AVX2/FMA/F16C, no AVX-512, no AMX), so a machine with AVX-512 catches what an
AVX2-only CPU (AMD Zen 1-3, Intel client cores) would: an instruction it lacks (SIGILL), a dispatch that picks a
build it cannot run, a test that assumes the host's features.

The lane is a venv-shaped folder whose `python` and `keel` start the suite's interpreter under
`qemu-x86_64 -cpu Haswell`: a test's subprocess (`sys.executable`) runs emulated too. /proc/cpuinfo still
describes the host there, so the lane tells the tests the model's flags (keel_dev.cpu.EMULATED). On a CPU
without AVX-512 the suite itself is that lane and this test skips (KEEL_TEST_EMULATED=1 runs it anyway).

`keel generate` runs a small random checkpoint with SmolLM2's head layout, not the demo model: qemu's TCG
computes SSE/AVX floating point in software, too slowly for the demo model within a test (measured:
docs/measurements/2026-12-07-suite-time-amx.md). The same CLI, engine, kernels and ISA dispatch run; only the
weights are smaller.
"""

from __future__ import annotations

import os
import re
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
]
NEW_TOKENS = 4
# SmolLM2's head size and grouping (head_dim 64, 3 query heads per KV head), two layers, a small vocabulary
TINY = dict(
    vocab_size=512,
    hidden_size=192,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=3,
    num_key_value_heads=1,
)
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
def test_isa_compat_and_generate_pass_on_an_emulated_avx2_only_cpu(tmp_path):
    from keel_dev.checkpoints import write_random_llama

    python = make_lane(tmp_path / "lane")
    env = {**os.environ, keel_dev.cpu.EMULATED: keel_dev.cpu.HASWELL, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("KEEL_CPU_ISA", None)  # the emulated CPU's own level: its best build (avx2) is what must run
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(ROOT)]
    cmd += [f"--deselect={t}" for t in DESELECT] + LANE_TESTS
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary, out[-3000:]  # nothing skipped its way through

    model = write_random_llama(tmp_path / "tiny", **TINY)
    generate = [str(python.parent / "keel"), "generate", "--model", str(model), "--raw", "--prompt", "t5 t9 t3 t7"]
    generate += ["--max-tokens", str(NEW_TOKENS), "--no-stream"]
    proc = subprocess.run(generate, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the stats line: the emulated CPU chose the dtype keel's AVX2 build reads (bf16) and decoded every token
    assert "torch.bfloat16, cpu)" in proc.stderr, proc.stderr
    stats = re.search(r"keel: (\d+) tokens, .*finish: (\w+)", proc.stderr)
    assert stats and 1 <= int(stats[1]) <= NEW_TOKENS, proc.stderr
