"""The fuzz run: a worker process runs cases one after another and reports each outcome; the parent
counts them and starts a new worker after a crash or a hang.

    python -m keel_fuzz.ops --worker      (internal: reads `seed namespace op` lines on stdin)
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from keel_dev import child_env

from keel_fuzz.ops.cases import DEFECTS, OUTCOMES, Case


def worker() -> None:
    """Loads every library, says which ops it found, then answers one JSON outcome per case line."""
    from keel_fuzz.ops.cases import run_case
    from keel_fuzz.ops.examples import all_examples
    from keel_fuzz.ops.inventory import registered

    schemas = registered()
    examples = all_examples()
    print(json.dumps({"ready": True, "ops": sorted(schemas)}), flush=True)
    for line in sys.stdin:
        seed, ns, op = line.split()
        case = Case(int(seed), ns, op)
        print(json.dumps(run_case(case, schemas[case.qualname], examples)), flush=True)


@dataclass
class Report:
    """Outcome counts, overall and per op, and the defects (case, outcome, detail)."""

    counts: Counter[str] = field(default_factory=Counter)
    per_op: dict[str, Counter[str]] = field(default_factory=dict)
    defects: list[tuple[Case, str, str]] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)

    def add(self, case: Case, outcome: str, detail: str = "") -> None:
        self.counts[outcome] += 1
        self.per_op.setdefault(case.qualname, Counter())[outcome] += 1
        if outcome in DEFECTS:
            self.defects.append((case, outcome, detail))

    def summary(self) -> str:
        total = sum(self.counts.values())
        lines = [f"{total} cases over {len(self.ops)} ops: " + ", ".join(f"{k} {self.counts[k]}" for k in OUTCOMES)]
        for op, c in sorted(self.per_op.items()):
            lines.append(f"  {op:40s} " + " ".join(f"{k}={c[k]}" for k in OUTCOMES))
        for case, outcome, detail in self.defects[:20]:
            lines.append(f"  DEFECT {outcome}: seed={case.seed} {case.qualname}: {detail}")
        return "\n".join(lines)


class Worker:
    """One child process running cases (the same keel as this process: it starts next to it)."""

    def __init__(self) -> None:
        import keel

        self._stderr: IO[str] = tempfile.TemporaryFile("w+")  # a pipe nobody reads could fill up and block
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "keel_fuzz.ops", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=child_env(dict(os.environ, OMP_NUM_THREADS="1")),
            cwd=Path(keel.__file__).resolve().parent.parent,
        )
        ready = self._read(300.0)
        if not ready or not ready.get("ready"):
            raise RuntimeError(f"fuzz worker did not start: {self.stderr_tail()}")
        self.ops: list[str] = list(ready["ops"])

    def _read(self, timeout: float) -> dict[str, Any] | None:
        """The next JSON line; {} when the worker died (end of output), None on timeout."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {}

    def stderr_tail(self) -> str:
        """Kill the worker; the last line it wrote to stderr."""
        self.proc.kill()
        self.proc.wait()
        self._stderr.seek(0)
        lines = self._stderr.read().strip().splitlines()
        self._stderr.close()
        return lines[-1] if lines else ""

    def run(self, case: Case, timeout: float) -> tuple[str, str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{case.seed} {case.namespace} {case.op}\n")
        self.proc.stdin.flush()
        out = self._read(timeout)
        if not out:
            detail = self.stderr_tail()
            return ("hang" if out is None else "crash"), (detail or f"exit {self.proc.returncode}")
        return out["outcome"], out.get("error", "")

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        self._stderr.close()


def fuzz(
    cases_per_op: int,
    seed: int = 0,
    timeout: float = 20.0,
    log: Callable[[str], None] | None = None,
    ops: list[str] | None = None,
) -> Report:
    """`cases_per_op` cases (seeds seed..seed+n-1) for every registered op (or those of `ops`), round-robin."""
    worker_ = Worker()
    report = Report(ops=[q for q in worker_.ops if ops is None or q in ops])
    start = time.monotonic()
    try:
        for i in range(cases_per_op):
            for qualname in report.ops:
                ns, op = qualname.split("::")
                case = Case(seed + i, ns, op)
                outcome, detail = worker_.run(case, timeout)
                report.add(case, outcome, detail)
                if outcome in ("crash", "hang"):
                    worker_ = Worker()
            if log and (i + 1) % max(1, cases_per_op // 10) == 0:
                log(f"{(i + 1) * len(report.ops)} cases in {time.monotonic() - start:.0f} s: {dict(report.counts)}")
    finally:
        worker_.close()
    return report
