"""Fuzzes every op of every keel namespace (keel._oplist.NAMESPACES) in child processes.

Each case is rebuilt from its seed: a valid call of the op (EXAMPLES) with one to three arguments
mutated, or a call of random arguments built from the op's schema. Arguments cover real (CPU) and
meta tensors, every common dtype, ranks 0-4, 0-size dims, non-contiguous and expanded layouts,
huge and negative ints, nan/inf floats, and aliasing in-place arguments. A worker process runs the
cases one after another and reports each outcome; the parent restarts it after a crash or a hang.

Outcomes: ok (the op accepted the call), named (an error that names the op), unnamed (an error
that does not: a defect), crash (the worker died: a defect), hang (no answer in time: a defect),
harness (building the case failed: a bug of this harness, reported too).

  python tests/fuzz/harness.py --worker        (internal: reads seeds on stdin)
"""

from __future__ import annotations

import json
import os
import random
import select
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "int8", "uint8", "bool", "complex64")
SIZES = (0, 1, 2, 3, 4, 5, 8, 16)
HUGE_INTS = (0, 1, -1, 2, 3, 7, 64, -64, 2**31 - 1, 2**31, 2**62, 2**63 - 1, -(2**63))
ODD_FLOATS = (0.0, -0.0, 1e-6, 1.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e308, -1e-300)
ODD_ELEMENTS = (0.0, -0.0, float("nan"), float("inf"), float("-inf"), 3e38, -1e-30, 65504.0)  # fit float32


@dataclass(frozen=True, slots=True)
class Case:
    seed: int
    namespace: str
    op: str


# ---------------------------------------------------------------- case building (in the worker)


def _tensor(
    rng: random.Random, torch: Any, device: str, dtype: str | None = None, shape: tuple[int, ...] | None = None
) -> Any:
    """A random tensor: dtype, rank 0-4, sizes (0 included), layout, and odd values."""
    dt = getattr(torch, dtype or rng.choice(DTYPES))
    if shape is None:
        shape = tuple(rng.choice(SIZES) for _ in range(rng.randint(0, 4)))
    if device == "meta" and shape and rng.random() < 0.1:
        shape = (*shape[:-1], rng.choice((2**31, 2**40)))  # huge dims cost nothing on meta
    return _fill(rng, torch, torch.empty(shape, dtype=dt, device=device), layout=rng.random())


def _fill(rng: random.Random, torch: Any, t: Any, layout: float) -> Any:
    """Odd values (real tensors) and an odd layout: transposed, strided, expanded or contiguous."""
    if t.device.type != "meta" and t.numel():
        t = t.contiguous()
        if t.dtype.is_floating_point or t.dtype.is_complex:
            t.copy_(torch.randn(t.shape, dtype=torch.float32).to(t.dtype) * rng.choice((1.0, 1e-3, 1e4)))
            flat = t.view(-1)
            for _ in range(rng.randint(0, 3)):
                flat[rng.randrange(flat.numel())] = rng.choice(ODD_ELEMENTS)
        elif t.dtype == torch.bool:
            t.copy_(torch.rand(t.shape) > 0.5)
        else:
            info = torch.iinfo(t.dtype)
            vals = [v for v in HUGE_INTS if info.min <= v <= info.max]
            t.copy_(torch.tensor([rng.choice(vals) for _ in range(t.numel())], dtype=t.dtype).view(t.shape))
    if t.dim() >= 2 and layout < 0.15:
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    if t.dim() >= 1 and layout < 0.3:
        wide = torch.empty((*t.shape[:-1], t.shape[-1] * 2), dtype=t.dtype, device=t.device)
        view = wide[..., ::2]
        view.copy_(t)
        return view
    if t.dim() >= 1 and layout < 0.35 and t.shape[0] == 1:
        return t.expand(3, *t.shape[1:])  # stride 0: written in place, it overlaps itself
    return t


def _mutate(
    rng: random.Random, torch: Any, schema_args: list[tuple[str, str]], args: list[Any], device: str
) -> list[Any]:
    args = list(args)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(args))
        name, typ = schema_args[i]
        v = args[i]
        roll = rng.random()
        if "Tensor" in typ:
            if not isinstance(v, torch.Tensor) or roll < 0.25:
                args[i] = _tensor(rng, torch, device)
            elif roll < 0.45:
                args[i] = v.to(getattr(torch, rng.choice(DTYPES)))
            elif roll < 0.6 and v.dim():
                shape = list(v.shape)
                shape[rng.randrange(len(shape))] = rng.choice(SIZES)
                args[i] = _tensor(rng, torch, device, str(v.dtype).removeprefix("torch."), tuple(shape))
            elif roll < 0.7:
                args[i] = v.reshape(-1) if rng.random() < 0.5 else v[None]
            elif roll < 0.8:
                j = rng.randrange(len(args))  # alias: another tensor argument again, or a view of it
                other = args[j]
                if isinstance(other, torch.Tensor):
                    same_shape = other.shape == v.shape and rng.random() < 0.5
                    args[i] = other.view(v.shape) if same_shape and other.is_contiguous() else other
            elif roll < 0.9:
                args[i] = _fill(rng, torch, v.clone(), layout=rng.random())
            elif "?" in typ:
                args[i] = None
            elif v.device.type == "cpu":
                args[i] = v.to("meta")
            elif v.numel() <= 4096:  # another device than the other arguments
                args[i] = torch.zeros(v.shape, dtype=v.dtype)
        elif typ in ("int", "SymInt"):
            args[i] = rng.choice(HUGE_INTS)
        elif typ == "float":
            args[i] = rng.choice(ODD_FLOATS)
        elif typ == "bool":
            args[i] = not v
        if rng.random() < 0.05:  # wrong Python type altogether
            args[i] = rng.choice((None, "x", 1.5, 3, [1, 2]))
    return args


def _random_args(rng: random.Random, torch: Any, schema_args: list[tuple[str, str]], device: str) -> list[Any]:
    out: list[Any] = []
    for _, typ in schema_args:
        if "Tensor" in typ:
            out.append(None if "?" in typ and rng.random() < 0.3 else _tensor(rng, torch, device))
        elif typ in ("int", "SymInt"):
            out.append(rng.choice(HUGE_INTS))
        elif typ == "float":
            out.append(rng.choice(ODD_FLOATS))
        elif typ == "bool":
            out.append(rng.random() < 0.5)
        else:
            out.append(None)
    return out


def build_call(case: Case) -> tuple[Callable[..., Any], list[Any]]:
    """The op and the arguments of `case` (deterministic in the seed)."""
    import torch
    from examples import EXAMPLES  # tests/fuzz/examples.py

    rng = random.Random(case.seed)
    torch.manual_seed(case.seed)
    overload = getattr(getattr(torch.ops, case.namespace), case.op).default
    # the schema's argument names and types (OpOverload._schema: tests only; keel itself never uses it)
    schema_args = [(a.name, str(a.type)) for a in overload._schema.arguments]
    device = "meta" if rng.random() < 0.35 else "cpu"
    example = EXAMPLES.get(f"{case.namespace}::{case.op}")
    if example is not None and rng.random() < 0.85:
        dtype = rng.choice(("float32", "bfloat16", "float16"))
        args = example(rng, torch, device, getattr(torch, dtype))
        if rng.random() < 0.9:
            args = _mutate(rng, torch, schema_args, args, device)
    else:
        args = _random_args(rng, torch, schema_args, device)
    return overload, args


def names_op(message: str, case: Case) -> bool:
    """keel's own messages say `keel::op`; torch's dispatcher and FakeTensor say `keel::op(` or `keel.op.default`."""
    return f"{case.namespace}::{case.op}" in message or f"{case.namespace}.{case.op}" in message


def run_case(case: Case) -> dict[str, str]:
    try:
        overload, args = build_call(case)
    except Exception as exc:  # the harness's own bug, not the op's: counted apart
        return {"outcome": "harness", "error": f"{type(exc).__name__}: {exc}"[:400]}
    try:
        overload(*args)
    except Exception as exc:  # every error is fine if it names the op
        msg = f"{type(exc).__name__}: {exc}"
        return {"outcome": "named" if names_op(msg, case) else "unnamed", "error": msg[:400]}
    return {"outcome": "ok"}


def worker() -> None:
    """Reads `seed namespace op` lines on stdin; writes one JSON outcome per line."""
    sys.path.insert(0, str(Path(__file__).parent))
    import torch  # noqa: F401

    import keel  # noqa: F401

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        seed, ns, op = line.split()
        print(json.dumps(run_case(Case(int(seed), ns, op))), flush=True)


# ---------------------------------------------------------------- the parent


OUTCOMES = ("ok", "named", "unnamed", "crash", "hang", "harness")


@dataclass
class Report:
    counts: Counter = field(default_factory=Counter)
    per_op: dict[str, Counter] = field(default_factory=dict)
    defects: list[tuple[Case, str, str]] = field(default_factory=list)  # (case, outcome, detail)

    def add(self, case: Case, outcome: str, detail: str = "") -> None:
        self.counts[outcome] += 1
        self.per_op.setdefault(f"{case.namespace}::{case.op}", Counter())[outcome] += 1
        if outcome in ("unnamed", "crash", "hang", "harness"):
            self.defects.append((case, outcome, detail))

    def summary(self) -> str:
        lines = [f"{sum(self.counts.values())} cases: " + ", ".join(f"{k} {self.counts.get(k, 0)}" for k in OUTCOMES)]
        for op, c in sorted(self.per_op.items()):
            lines.append(f"  {op:32s} " + " ".join(f"{k}={c.get(k, 0)}" for k in OUTCOMES))
        for case, outcome, detail in self.defects[:20]:
            lines.append(f"  DEFECT {outcome}: seed={case.seed} {case.namespace}::{case.op}: {detail}")
        return "\n".join(lines)


class Worker:
    """One child process running cases; restarted after a crash or hang."""

    def __init__(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=Path(__file__).parent,
        )
        ready = self._read(120.0)
        if ready is None or not ready.get("ready"):
            raise RuntimeError(f"fuzz worker did not start: {self.stderr_tail()}")

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
        return (err or "").strip().splitlines()[-1:][0] if (err or "").strip() else ""

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
            self.proc.wait(timeout=30)


def all_ops(namespaces: dict[str, tuple[str, ...]] | None = None) -> list[tuple[str, str]]:
    if namespaces is None:
        from keel._oplist import NAMESPACES

        namespaces = NAMESPACES
    return [(ns, op) for ns, ops in namespaces.items() if ns.startswith("keel") for op in ops]


def fuzz(cases_per_op: int, seed: int = 0, timeout: float = 20.0, log: Callable[[str], None] | None = None) -> Report:
    """Run `cases_per_op` cases for every op, seeds seed..seed+n-1, round-robin over the ops."""
    report = Report()
    ops = all_ops()
    worker_ = Worker()
    start = time.monotonic()
    try:
        for i in range(cases_per_op):
            for ns, op in ops:
                case = Case(seed + i, ns, op)
                outcome, detail = worker_.run(case, timeout)
                report.add(case, outcome, detail)
                if outcome in ("crash", "hang"):
                    worker_ = Worker()
            if log and (i + 1) % max(1, cases_per_op // 10) == 0:
                log(f"{(i + 1) * len(ops)} cases in {time.monotonic() - start:.0f} s: {dict(report.counts)}")
    finally:
        worker_.close()
    return report


if __name__ == "__main__" and "--worker" in sys.argv:
    worker()
