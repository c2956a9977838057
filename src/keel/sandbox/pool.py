"""`WorkerPool`: jobs on untrusted input run in killable worker processes (`child.py`) with limits.

Each job has a deadline: it waits in a FIFO queue for a worker at most until then (`Busy` past it), and a
running job is killed at min(start + run_s, deadline) (`LimitExceeded("time")`); the worker's own limits
end it past its memory (RLIMIT_AS) or CPU time (RLIMIT_CPU). A killed or dead worker is replaced at once,
so the next job finds a fresh one. `cancel` drops a queued job and kills the worker of a running one: an
abandoned job never runs on. One thread per worker talks to its process; nothing here uses the event loop
or the default executor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import queue
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHILD = Path(__file__).with_name("child.py")
START_TIMEOUT_S = 60.0


class WorkerError(Exception):
    """Base of what a pool job can raise."""


class JobFailed(WorkerError, ValueError):
    """The handler refused the job's input (the message says why)."""


class LimitExceeded(WorkerError):
    """The job passed a limit (`limit`: "time", "memory", "cpu" or "crash"); its worker was ended."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


class Busy(WorkerError):
    """No worker took the job before its deadline, or too many jobs wait already."""


class Abandoned(WorkerError):
    """The job was cancelled."""


@dataclass(frozen=True, slots=True)
class WorkerLimits:
    """What one job may use: address space above the worker's baseline, CPU seconds, stack of its thread."""

    memory_mib: int = 512
    cpu_s: float = 10.0
    stack_mib: int = 256

    def __post_init__(self) -> None:
        if self.memory_mib < 16 or not self.cpu_s > 0 or self.stack_mib < 1:
            raise ValueError(
                f"WorkerLimits: memory_mib >= 16, cpu_s > 0 and stack_mib >= 1 expected, got {self.memory_mib}, "
                f"{self.cpu_s}, {self.stack_mib}"
            )


@dataclass(slots=True)
class _Job:
    future: concurrent.futures.Future[Any]
    payload: dict[str, Any]
    run_s: float
    deadline: float
    start_by: float


class _Process:
    """One worker process: started with its setup frame, answering one job at a time."""

    def __init__(self, handler: Path, setup: dict[str, Any]) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["MALLOC_ARENA_MAX"] = "2"  # each extra arena reserves 64 MiB of the capped address space
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(CHILD), str(handler)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
            close_fds=True,
        )
        self.killed_for: str | None = None
        self._send(setup)
        ready = self._receive(time.monotonic() + START_TIMEOUT_S)
        if ready is None or not ready.get("ready"):
            self.kill("start")
            raise WorkerError(f"a sandbox worker did not start: {self.death()}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        payload = json.dumps(obj).encode("utf-8")
        self.proc.stdin.write(struct.pack(">I", len(payload)) + payload)
        self.proc.stdin.flush()

    def _read(self, n: int, until: float) -> bytes | None:
        assert self.proc.stdout is not None
        fd, out = self.proc.stdout.fileno(), bytearray()
        while len(out) < n:
            left = until - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return bytes(out)

    def _receive(self, until: float) -> dict[str, Any] | None:
        """The next frame, None past `until`; EOFError when the process ended."""
        head = self._read(4, until)
        if head is None:
            return None
        (n,) = struct.unpack(">I", head)
        body = self._read(n, until)
        return None if body is None else json.loads(body)

    def call(self, payload: dict[str, Any], cpu_s: float, until: float) -> dict[str, Any]:
        """The child's answer frame; past `until` the process is killed, and any end of it is a LimitExceeded."""
        try:
            self._send({"job": payload, "cpu_s": cpu_s})
            got = self._receive(until)
        except (OSError, EOFError, ValueError, struct.error):
            got = None
            if self.alive():
                self.kill("protocol")
        if got is None:
            if self.alive():
                self.kill("time")
            raise self.failure()
        return got

    def kill(self, why: str) -> None:
        if self.killed_for is None:
            self.killed_for = why
        if self.alive():
            self.proc.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        if self.alive() and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()  # the child exits on end of input
                self.proc.wait(2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill("close")
        self.stderr.close()

    def death(self) -> str:
        """What ended the process: its signal and the last line it wrote to stderr."""
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        code = self.proc.returncode
        what = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit status {code}"
        self.stderr.seek(0, os.SEEK_END)
        self.stderr.seek(max(0, self.stderr.tell() - 2048))
        lines = self.stderr.read().decode("utf-8", "replace").strip().splitlines()
        return what + (f" ({lines[-1][:300]})" if lines else "")

    def failure(self) -> LimitExceeded:
        """The limit that ended the process: our kill at the deadline, SIGXCPU, or an allocation that failed."""
        if self.killed_for in ("time", "cancel"):
            return LimitExceeded("time", "time")
        how = self.death()
        code = self.proc.returncode
        if code == -signal.SIGXCPU:
            return LimitExceeded("cpu", how)
        if "memory" in how.lower() or "alloc" in how.lower() or code == -signal.SIGABRT:
            return LimitExceeded("memory", how)
        return LimitExceeded("crash", how)


class WorkerPool:
    """`workers` processes running `handler` (a module file defining `Handler(init)`, called per job)."""

    def __init__(
        self,
        name: str,
        handler: Path,
        init: dict[str, Any] | None = None,
        *,
        workers: int = 2,
        limits: WorkerLimits | None = None,
        max_pending: int = 64,
    ) -> None:
        if workers < 1 or max_pending < 0:
            raise ValueError(
                f"WorkerPool {name}: workers >= 1 and max_pending >= 0 expected, got {workers}, {max_pending}"
            )
        self.name, self.handler, self.limits = name, handler, limits or WorkerLimits()
        self.max_pending = max_pending
        self._setup = {"init": init or {}, "memory_mib": self.limits.memory_mib, "stack_mib": self.limits.stack_mib}
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._pending = 0
        self._running: dict[int, tuple[_Job, _Process | None]] = {}  # slot -> its job and process
        self._abandoned: set[int] = set()  # ids of running futures whose caller gave up
        self._procs: list[_Process | None] = [None] * workers
        self._closed = False
        self.num_killed = 0  # workers ended by a limit or a cancel
        self.num_started = 0
        self._threads = [
            threading.Thread(target=self._serve, args=(i,), name=f"keel-{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    @property
    def pending(self) -> int:
        """Jobs waiting for a worker."""
        return self._pending

    def pids(self) -> list[int]:
        """The live workers' process ids."""
        return [p.pid for p in self._procs if p is not None and p.alive()]

    def submit(
        self, payload: dict[str, Any], *, run_s: float, deadline: float | None = None, start_by: float | None = None
    ) -> concurrent.futures.Future[Any]:
        """Queue a job: it must start by `start_by` (default: the deadline; else Busy), runs at most `run_s`
        seconds and is killed at `deadline` (monotonic; default now + run_s). Raises Busy when `max_pending`
        jobs wait already."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        end = deadline if deadline is not None else time.monotonic() + run_s
        job = _Job(fut, payload, run_s, end, start_by if start_by is not None else end)
        with self._lock:
            if self._closed:
                raise Busy(f"the {self.name} workers are shut down")
            if self._pending >= self.max_pending:
                raise Busy(f"{self._pending} jobs wait for the {self.name} workers already; retry later")
            self._pending += 1
        self._queue.put(job)
        return fut

    def cancel(self, fut: concurrent.futures.Future[Any]) -> None:
        """Give up on a job: a queued one is dropped, a running one's worker is killed."""
        with self._lock:
            if fut.done():
                return
            if fut.cancel():
                self._pending -= 1
                return
            for job, proc in self._running.values():
                if job.future is fut:
                    self._abandoned.add(id(fut))
                    if proc is not None:
                        proc.kill("cancel")
                        self.num_killed += 1

    def call(
        self, payload: dict[str, Any], *, run_s: float, deadline: float | None = None, start_by: float | None = None
    ) -> Any:
        """Run a job and wait for its result (blocking)."""
        fut = self.submit(payload, run_s=run_s, deadline=deadline, start_by=start_by)
        try:
            return fut.result()
        except BaseException:
            self.cancel(fut)
            raise

    async def run(
        self, payload: dict[str, Any], *, run_s: float, deadline: float | None = None, start_by: float | None = None
    ) -> Any:
        """Run a job from the event loop; a cancelled caller cancels the job."""
        fut = self.submit(payload, run_s=run_s, deadline=deadline, start_by=start_by)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            self.cancel(fut)
            raise

    def close(self) -> None:
        with self._lock:
            self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for i, proc in enumerate(self._procs):
            if proc is not None:
                proc.close()
                self._procs[i] = None

    # ---- worker threads ---------------------------------------------------------------------------

    def _process(self, slot: int) -> _Process:
        proc = self._procs[slot]
        if proc is None or not proc.alive():
            if proc is not None:
                proc.close()
            proc = self._procs[slot] = _Process(self.handler, self._setup)
            self.num_started += 1
        return proc

    def _serve(self, slot: int) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._lock:
                if not job.future.set_running_or_notify_cancel():
                    continue  # cancelled while queued (cancel counted it)
                self._pending -= 1
            try:
                job.future.set_result(self._run(slot, job))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                job.future.set_exception(exc)
            finally:
                with self._lock:
                    self._running.pop(slot, None)
                    self._abandoned.discard(id(job.future))
            if not self._closed:
                self._replace_dead(slot)

    def _replace_dead(self, slot: int) -> None:
        """Start a fresh worker where the last one was killed, before the next job needs it."""
        proc = self._procs[slot]
        if proc is not None and not proc.alive():
            try:
                self._process(slot)
            except WorkerError:
                pass  # the next job tries again and reports it

    def _run(self, slot: int, job: _Job) -> Any:
        busy = f"every {self.name} worker stayed busy until this job's deadline; retry later"
        if time.monotonic() > min(job.start_by, job.deadline):
            raise Busy(busy)
        with self._lock:
            self._running[slot] = (job, None)
        proc = self._process(slot)
        now = time.monotonic()
        until = min(now + job.run_s, job.deadline)
        if until <= now:
            raise Busy(busy)
        with self._lock:
            if id(job.future) in self._abandoned or job.future.cancelled():
                raise Abandoned(f"the {self.name} job was cancelled")
            self._running[slot] = (job, proc)
        try:
            got = proc.call(job.payload, self.limits.cpu_s, until)
        except LimitExceeded as exc:
            with self._lock:
                if id(job.future) in self._abandoned:
                    raise Abandoned(f"the {self.name} job was cancelled") from None
                self.num_killed += 1
            raise self._describe(exc, until - now) from None
        if "ok" in got:
            return got["ok"]
        if "memory" in got:
            raise self._describe(LimitExceeded("memory", str(got["memory"])), until - now)
        raise JobFailed(str(got.get("error", "the worker gave no answer")))

    def _describe(self, exc: LimitExceeded, run_s: float) -> LimitExceeded:
        """The limit in words a client reads: which one and its value."""
        text = {
            "time": f"did not finish within this server's limit of {run_s:.3g} s",
            "memory": f"needed more than this server's limit of {self.limits.memory_mib} MiB of memory",
            "cpu": f"used more than this server's limit of {self.limits.cpu_s:g} s of CPU time",
        }.get(exc.limit, f"ended its worker process ({exc})")
        return LimitExceeded(exc.limit, text)
