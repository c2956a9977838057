"""Run a piece of Python in a child process with a bound on its memory: the child is killed when its RSS
passes the bound (a regression fails its test instead of exhausting the machine); peak RSS from /proc (VmHWM).

Also `sparse_checkpoint`: a checkpoint folder whose config.json is edited and whose model.safetensors has
exactly the tensors the edited config implies, as a sparse file of zeros (GiBs of weights, KBs on disk).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1 << 30
RSS_LIMIT = GIB

# builds the engine as `keel generate` and `keel serve` do; a checkpoint error exits 3 with its message
LOAD_ENGINE = """
import sys
from keel.engine.llm_engine import LLMEngine
from keel.hf.errors import CheckpointError
try:
    LLMEngine(sys.argv[1], device="cpu", dtype="float32", progress=False)
except CheckpointError as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(3)
"""


@dataclass(frozen=True)
class Child:
    rc: int
    stderr: str
    peak_rss: int
    killed: bool

    def describe(self) -> str:
        killed = " (killed at the bound)" if self.killed else ""
        return f"exit {self.rc}, peak RSS {self.peak_rss / (1 << 20):.0f} MiB{killed}: {self.stderr[-1500:]}"


def _rss(pid: int) -> int:
    return _status_bytes(pid, "VmRSS:")


def _status_bytes(pid: int, key: str) -> int:
    """A size line of /proc/PID/status in bytes (0 once the process is gone). VmHWM is the peak RSS of the
    process's own address space: wait4's ru_maxrss is not, since exec records the RSS the forked parent had
    (a pytest process holding models reports gigabytes for a child that used megabytes)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_child(
    code: str, *args: str, env: dict[str, str] | None = None, limit: int = RSS_LIMIT, timeout: float = 180.0
) -> Child:
    """`python -c CODE ARGS...` with this environment (plus `env`), killed past `limit` bytes of RSS."""
    full_env = {**os.environ, **(env or {})}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args], stdout=subprocess.DEVNULL, stderr=err, env=full_env, cwd="/"
        )
        killed, peak = False, 0
        deadline = time.monotonic() + timeout
        while True:
            peak = max(peak, _status_bytes(proc.pid, "VmHWM:"))
            pid, status, _usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if not killed and (_rss(proc.pid) > limit or time.monotonic() > deadline):
                proc.kill()
                killed = True
            time.sleep(0.01)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    return Child(proc.returncode, text, peak, killed)


def copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def sparse_checkpoint(src: Path, dst: Path, **config: Any) -> Path:
    """`src` copied to `dst` with `config` merged into config.json and a model.safetensors of zeros (sparse)
    holding every tensor the new config implies, float32, with its implied shape."""
    from keel.hf.checkpoint import expected_tensors
    from keel.hf.config import ModelConfig

    copy_checkpoint(src, dst)
    raw = json.loads((dst / "config.json").read_text()) | config
    (dst / "config.json").write_text(json.dumps(raw))
    cfg = ModelConfig.from_dict(raw)
    header: dict[str, Any] = {}
    at = 0
    for name, (shape, _why) in expected_tensors(cfg).items():
        n = 4
        for dim in shape:
            n *= dim
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    weights = dst / "model.safetensors"
    weights.unlink()
    with open(weights, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text)
        fh.truncate(8 + len(text) + at)
    return dst
