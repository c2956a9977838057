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
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hostile_inputs import run_bounded  # audit/tests: the same RSS-bounded child runner

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


def run_child(
    code: str, *args: str, env: dict[str, str] | None = None, limit: int = RSS_LIMIT, timeout: float = 180.0
) -> Child:
    """`python -c CODE ARGS...` with this environment (plus `env`), killed past `limit` bytes of RSS."""
    full_env = {**os.environ, **(env or {})}
    return Child(*run_bounded([sys.executable, "-c", code, *args], full_env, limit, timeout, cwd="/"))


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
