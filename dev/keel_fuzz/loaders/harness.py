"""Loader fuzzer: mutate a real checkpoint (HF folder, GGUF file), load each copy through keel's public path.

HF mutations are loaded with `keel.LLM(folder)`, then used (one generated token, the chat template
rendered); GGUF mutations are installed with `keel.gguf.install.install_gguf` into a fresh cache (the
`keel models fetch-demo --gguf` path) and, when that works, loaded and used the same way. A worker
process runs the cases one after another (address space capped, so that a wild allocation fails
instead of swapping); the parent restarts it after a crash or a hang.

Outcomes:
  load     the copy loaded and worked (a legitimate outcome for a mutation of tensor bytes, or of
           something keel ignores or accepts)
  clear    an error of keel's checkpoint family that names the file and the field, key or tensor
and the defects:
  unclear  any other error: a bare TypeError/KeyError/..., a torch allocation failure, or a message
           that does not name the file and the field
  refused  an error on a copy that is still valid (a mutation marked legitimate)
  dirty    a failed install that left files in the cache
  crash    the worker died
  hang     no answer within the timeout

  python -m keel_fuzz.loaders --worker HF_SOURCE GGUF_SOURCE WORKDIR    (internal: mutations on stdin)
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel_dev import child_env

from keel_fuzz.loaders.mutations import Mutation

# keel's checkpoint error family, by class name (so that the harness also runs against older keel code)
KEEL_ERRORS = frozenset(
    {
        "CheckpointError",
        "ConfigError",
        "WeightsError",
        "TokenizerError",
        "GGUFError",
        "ModelNotFoundError",
        "UnsupportedArchitectureError",
    }
)
DEFECTS = ("unclear", "refused", "dirty", "crash", "hang")
OUTCOMES = ("load", "clear", *DEFECTS)
ADDRESS_SPACE = 16 << 30  # the worker's RLIMIT_AS


def classify(exc: BaseException, m: Mutation) -> str:
    """clear / unclear / refused for an error raised while loading or using mutation `m`."""
    if not m.fields:
        return "refused"
    names = {c.__name__ for c in type(exc).__mro__}
    msg = str(exc)
    named = m.file in msg and ("*" in m.fields or any(f in msg for f in m.fields))
    return "clear" if names & KEEL_ERRORS and named else "unclear"


def _use(llm: Any) -> None:
    """What a loaded model must survive: one generated token and its chat template."""
    import keel

    llm.generate("Hi", keel.SamplingParams(max_tokens=1))
    if llm.tokenizer.chat_template is not None:
        llm.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])


def _load_folder(folder: Path) -> Any:
    import keel

    return keel.LLM(str(folder), dtype="bfloat16", device="cpu", progress=False, max_kv_cache_bytes=64 << 20)


class _Sources:
    """The real inputs, parsed once per worker."""

    def __init__(self, hf: Path | None, gguf: Path | None) -> None:
        self.hf, self.gguf = hf, gguf
        self._layout: Any = None

    def layout(self) -> Any:
        if self._layout is None:
            from keel_fuzz.loaders import gguf_layout

            assert self.gguf is not None
            self._layout = gguf_layout.parse(self.gguf.read_bytes())
        return self._layout


def run_case(m: Mutation, src: _Sources, workdir: Path) -> dict[str, str]:
    """Build the mutated copy in a fresh folder, load and use it; the outcome and the error seen."""
    import gc
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(dir=workdir))
    phase = "mutate"
    try:
        if m.target == "hf":
            from keel_fuzz.loaders.mutations import apply_hf

            assert src.hf is not None
            folder = apply_hf(m, src.hf, tmp / "model")
        else:
            from keel.gguf.install import install_gguf
            from keel_fuzz.loaders.gguf_mutations import apply_gguf

            assert src.gguf is not None
            path = apply_gguf(m, src.gguf, src.layout(), tmp)
            cache = tmp / "cache"
            phase = "install"
            try:
                folder = install_gguf(path, "keel/fuzz", cache_dir=cache, dtype="bfloat16").snapshot
            except Exception as exc:
                left = sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) if cache.exists() else []
                if left:
                    return {"outcome": "dirty", "phase": phase, "error": f"left in the cache: {left[:5]}"}
                return {"outcome": classify(exc, m), "phase": phase, "error": _describe(exc)}
        phase = "load"
        try:
            llm = _load_folder(folder)
            phase = "use"
            _use(llm)
        except Exception as exc:
            return {"outcome": classify(exc, m), "phase": phase, "error": _describe(exc)}
        del llm
        return {"outcome": "load", "phase": phase}
    except Exception as exc:  # building the mutation failed: the harness's bug, reported as such
        if phase == "mutate":
            return {"outcome": "harness", "phase": phase, "error": _describe(exc)}
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        gc.collect()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def worker(hf: str, gguf: str, workdir: str) -> None:
    """Reads one mutation (JSON) per line on stdin; writes one JSON outcome per line."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    import torch

    import keel  # noqa: F401

    torch.set_num_threads(1)
    src = _Sources(Path(hf) if hf != "-" else None, Path(gguf) if gguf != "-" else None)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps(run_case(Mutation.from_json(line), src, Path(workdir))), flush=True)


# ---------------------------------------------------------------- the parent


@dataclass
class Report:
    counts: Counter = field(default_factory=Counter)
    by_file: dict[str, Counter] = field(default_factory=dict)
    rows: list[tuple[Mutation, str, str]] = field(default_factory=list)  # (mutation, outcome, detail)

    def add(self, m: Mutation, outcome: str, detail: str = "") -> None:
        self.counts[outcome] += 1
        self.by_file.setdefault(f"{m.target}:{m.file}", Counter())[outcome] += 1
        self.rows.append((m, outcome, detail))

    @property
    def defects(self) -> list[tuple[Mutation, str, str]]:
        return [r for r in self.rows if r[1] in (*DEFECTS, "harness")]

    @property
    def body_loads(self) -> int:
        return sum(1 for m, o, _ in self.rows if m.body and o == "load")

    def summary(self, show: int = 40) -> str:
        total = sum(self.counts.values())
        lines = [f"{total} mutations: " + ", ".join(f"{k} {self.counts.get(k, 0)}" for k in (*OUTCOMES, "harness"))]
        lines.append(f"  loads after a mutation of tensor bytes only: {self.body_loads}")
        for name, c in sorted(self.by_file.items()):
            lines.append(f"  {name:40s} " + " ".join(f"{k}={c[k]}" for k in OUTCOMES if c.get(k)))
        for m, outcome, detail in self.defects[:show]:
            lines.append(f"  DEFECT {outcome}: {m.id}: {detail}")
        return "\n".join(lines)


class Worker:
    """One child process running cases; restarted after a crash or hang."""

    def __init__(self, hf: Path | None, gguf: Path | None, workdir: Path) -> None:
        env = child_env(dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false"))
        args = [str(hf or "-"), str(gguf or "-"), str(workdir)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "keel_fuzz.loaders", "--worker", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=workdir,
        )
        ready = self._read(300.0)
        if not ready or not ready.get("ready"):
            raise RuntimeError(f"loader fuzz worker did not start: {self.stderr_tail()}")

    def _read(self, timeout: float) -> dict[str, str] | None:
        """The next JSON line; {} when the worker died (end of output), None on timeout."""
        assert self.proc.stdout is not None
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {}

    def stderr_tail(self) -> str:
        self.proc.kill()
        _, err = self.proc.communicate()
        lines = (err or "").strip().splitlines()
        return " | ".join(lines[-3:])[:500]

    def run(self, m: Mutation, timeout: float) -> tuple[str, str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(m.to_json() + "\n")
        self.proc.stdin.flush()
        out = self._read(timeout)
        if not out:
            detail = self.stderr_tail()
            return ("hang" if out is None else "crash"), (detail or f"exit {self.proc.returncode}")
        detail = f"[{out.get('phase')}] {out.get('error', '')}".strip()
        return out["outcome"], detail

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def fuzz(
    mutations: list[Mutation],
    hf: Path | None,
    gguf: Path | None,
    workdir: Path,
    timeout: float = 300.0,
    log: Callable[[str], None] | None = None,
) -> Report:
    """Run every mutation; `hf` / `gguf` are the unmutated sources (a checkpoint folder, a GGUF file)."""
    report = Report()
    w = Worker(hf, gguf, workdir)
    start = time.monotonic()
    try:
        for i, m in enumerate(mutations):
            outcome, detail = w.run(m, timeout)
            report.add(m, outcome, detail)
            if log:
                log(f"[{i + 1}/{len(mutations)} {time.monotonic() - start:.0f}s] {outcome:8s} {m.id}  {detail[:160]}")
            if outcome in ("crash", "hang"):
                w = Worker(hf, gguf, workdir)
    finally:
        w.close()
    return report
