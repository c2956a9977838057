"""`AsyncEngine`: a single-threaded engine (`LLMEngine`) driven from one background thread, for asyncio callers.

The engine is not thread-safe, so exactly one thread touches it. Callers on the event loop send
commands (add / abort / stop) through a thread-safe queue that the engine thread drains between
steps; each step's outputs go back to the owning request's `asyncio.Queue` with
`loop.call_soon_threadsafe`. A sub-request counts against the admission bound from the moment it is
accepted until the engine finishes it or its stream is closed, whichever comes first, which bounds the
engine's waiting queue (`Overloaded`): a caller slow to read what the engine already produced holds
no slot. Nothing here knows HTTP: `keel serve` (src/keel/entrypoints/openai) builds on it.
"""

from __future__ import annotations

import asyncio
import ctypes
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from keel.engine.output import EngineMetrics, RequestOutput
from keel.engine.sampling_params import SamplingParams


class SyncEngine(Protocol):
    """What `AsyncEngine` drives: `LLMEngine`'s request API (a test double needs only these)."""

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        *,
        client: str | None = None,
    ) -> None: ...

    def abort_request(self, request_id: str) -> None: ...

    def step(self) -> list[RequestOutput]: ...

    def has_unfinished_requests(self) -> bool: ...

    def metrics(self) -> EngineMetrics: ...


EngineT = TypeVar("EngineT", bound=SyncEngine)


class Overloaded(RuntimeError):
    """More requests are in flight than the server admits (running + waiting bound)."""


class EngineDead(RuntimeError):
    """The engine thread has stopped; no request can be served."""


class Drained(EngineDead):
    """The server stopped waiting for this request while shutting down (`AsyncEngine.end_open`)."""


@dataclass(slots=True)
class _Add:
    ids: list[str]
    prompts: list[list[int]]
    params: list[SamplingParams]
    loop: asyncio.AbstractEventLoop
    stream: RequestStream
    added: asyncio.Future
    client: str | None = None


@dataclass(slots=True)
class _Abort:
    ids: list[str]


_STOP = object()


@dataclass(eq=False)
class RequestStream:
    """The outputs of one caller's sub-requests (for `keel serve`, one per choice), interleaved as they come.

    Iterating yields engine `RequestOutput`s until every sub-request has finished; `close()` (also
    called on any exit of `AsyncEngine.open`) aborts whatever is unfinished and releases the
    admission slot. Safe to call more than once.
    """

    engine: AsyncEngine[Any]
    ids: list[str]
    outputs: asyncio.Queue
    unfinished: set[str] = field(default_factory=set)  # not yet read to their final output
    admitted: set[str] = field(default_factory=set)  # holding an admission slot (the engine is not done)
    closed: bool = False

    def __post_init__(self) -> None:
        self.unfinished = set(self.ids)
        self.admitted = set(self.ids)

    def _engine_done(self, request_id: str) -> None:
        """The engine finished a sub-request: its admission slot is free, whether or not it was read yet."""
        if request_id in self.admitted:
            self.admitted.discard(request_id)
            self.engine._admitted -= 1

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        while self.unfinished:
            out = await self.outputs.get()
            if isinstance(out, BaseException):
                raise out
            if out.finished:
                self.unfinished.discard(out.request_id)
            yield out

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.unfinished:
            self.engine._commands.put(_Abort(sorted(self.unfinished)))
            self.engine.num_aborted += len(self.unfinished)
            self.unfinished.clear()
        self.engine._admitted -= len(self.admitted)
        self.admitted.clear()
        self.engine._num_open -= len(self.ids)
        self.engine._open.discard(self)


class AsyncEngine(Generic[EngineT]):
    """Owns an `LLMEngine` (or anything with its request API, `SyncEngine`) in one thread."""

    def __init__(self, engine: EngineT, *, max_admitted: int, rate_window_s: float = 10.0) -> None:
        """Drive `engine` (built already, on any thread) from a new engine thread. A model should rather be
        built by `AsyncEngine.start`, on the thread that then runs it."""
        self._setup(engine, max_admitted, rate_window_s)
        self._thread = threading.Thread(target=self._run, name="keel-engine", daemon=True)
        self._thread.start()

    @classmethod
    def start(
        cls, build: Callable[[], EngineT], *, max_admitted: int, rate_window_s: float = 10.0
    ) -> AsyncEngine[EngineT]:
        """Start the engine thread, build the engine there with `build()` and return once it is built (what
        `build` raises is raised here, and no thread is left behind).

        Why on that thread: torch's CPU ops run their parallel regions on the OpenMP team of the thread that
        calls them. A model loaded on the main thread leaves the main thread's team alive beside the engine
        thread's; with more OpenMP threads than cores, libgomp's workers stop spinning between regions and
        every region of a step waits for a sleeping worker to wake, which slowed prefill steps on a 2-core
        machine (docs/measurements/2026-12-03-prefetch.md). Built and run on one thread, the
        process has one team."""
        _check_admitted(max_admitted)
        ready: queue.SimpleQueue = queue.SimpleQueue()

        def main() -> None:
            name_os_thread("keel-engine")  # before the build: the OpenMP workers it starts inherit the name
            try:
                self = cls.__new__(cls)
                self._setup(build(), max_admitted, rate_window_s)
                self._thread = threading.current_thread()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
                ready.put(exc)
                return
            ready.put(self)
            self._run()

        thread = threading.Thread(target=main, name="keel-engine", daemon=True)
        thread.start()
        got = ready.get()
        if isinstance(got, BaseException):
            thread.join()
            raise got
        return got

    def _setup(self, engine: EngineT, max_admitted: int, rate_window_s: float) -> None:
        _check_admitted(max_admitted)
        self.engine = engine
        self.max_admitted = max_admitted
        self.num_rejected = 0  # open() calls refused as overloaded
        self.num_aborted = 0  # sub-requests closed before they finished (client gone, error)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._admitted = 0  # event-loop side: sub-requests accepted, not finished by the engine nor closed
        self._num_open = 0  # event-loop side: sub-requests of streams not yet closed
        self._open: set[RequestStream] = set()
        self._routes: dict[str, tuple[asyncio.AbstractEventLoop, RequestStream]] = {}  # engine thread only
        self._rate_window_s = rate_window_s
        self._rate_samples: deque[tuple[float, int]] = deque()
        self.metrics_snapshot = engine.metrics()
        self.tokens_per_s = 0.0
        self.steps = 0  # engine steps run so far (readiness: the engine has stepped)
        self.error: BaseException | None = None

    # ---- event-loop side ------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def num_open(self) -> int:
        """Sub-requests of streams not closed yet (a drain waits for these)."""
        return self._num_open

    @property
    def num_admitted(self) -> int:
        """Sub-requests the admission bound counts: accepted, and neither finished by the engine nor closed."""
        return self._admitted

    async def open(
        self, ids: list[str], prompts: list[list[int]], params: list[SamplingParams], client: str | None = None
    ) -> RequestStream:
        """Admit and add sub-requests (all or none) for `client` (the API key, else the connection's peer: the
        engine shares sequence slots and prefill among clients; None: the anonymous one); raises Overloaded,
        EngineDead or the engine's ValueError."""
        if not self.alive:
            raise EngineDead(f"the engine thread has stopped: {self.error!r}")
        if self._admitted + len(ids) > self.max_admitted:
            self.num_rejected += 1
            raise Overloaded(
                f"the server is overloaded: {self._admitted} requests are in flight and it admits "
                f"{self.max_admitted} (running + waiting); retry later"
            )
        loop = asyncio.get_running_loop()
        stream = RequestStream(self, ids, asyncio.Queue())
        self._admitted += len(ids)
        self._num_open += len(ids)
        self._open.add(stream)
        added = loop.create_future()
        try:
            self._commands.put(_Add(ids, prompts, params, loop, stream, added, client))
            await added
        except BaseException:
            if added.done() and not added.cancelled() and added.exception() is not None:
                stream.unfinished.clear()  # nothing was added: no abort needed
            stream.close()
            raise
        return stream

    def end_open(self, exc: BaseException) -> int:
        """End every open stream with `exc` (its reader raises it, then closes it: the engine aborts the rest).

        Event-loop side, for a drain that ran out of time; returns how many streams were ended."""
        ended = 0
        for stream in list(self._open):
            if stream.unfinished:
                stream.outputs.put_nowait(exc)
                ended += 1
        return ended

    def shutdown(self, timeout: float = 10.0) -> None:
        """Abort everything, stop the engine thread and wait for it."""
        self._commands.put(_STOP)
        self._thread.join(timeout)

    # ---- engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        name_os_thread(self._thread.name)
        try:
            while True:
                busy = self.engine.has_unfinished_requests()
                commands = [self._commands.get()] if not busy else []
                while True:
                    try:
                        commands.append(self._commands.get_nowait())
                    except queue.Empty:
                        break
                if any(c is _STOP for c in commands):
                    self._abort_all()
                    return
                for cmd in commands:
                    self._apply(cmd)
                if self.engine.has_unfinished_requests():
                    self._step()
                else:
                    self._snapshot()
        except BaseException as exc:  # a broken engine: fail every waiting caller, then stop
            self.error = exc
            self._fail_all(exc)

    def _apply(self, cmd: _Add | _Abort) -> None:
        if isinstance(cmd, _Abort):
            for rid in cmd.ids:
                self._routes.pop(rid, None)
                self.engine.abort_request(rid)
            return
        done: list[str] = []
        try:
            who = {} if cmd.client is None else {"client": cmd.client}  # (SyncEngine doubles may not take it)
            for rid, prompt, params in zip(cmd.ids, cmd.prompts, cmd.params, strict=True):
                self.engine.add_request(rid, prompt, params, **who)
                done.append(rid)
        except (ValueError, TypeError) as exc:  # bad request: undo the ones already added
            for rid in done:
                self.engine.abort_request(rid)
            cmd.loop.call_soon_threadsafe(_resolve, cmd.added, exc)
            return
        for rid in done:
            self._routes[rid] = (cmd.loop, cmd.stream)
        cmd.loop.call_soon_threadsafe(_resolve, cmd.added, None)

    def _step(self) -> None:
        """One engine step; the metrics are published before its outputs reach the callers, so a client
        that reads /metrics after its response sees its own tokens counted."""
        try:
            outputs = self.engine.step()
            self.steps += 1
        except Exception as exc:  # fail the requests in flight, free their blocks, keep serving
            for rid in list(self._routes):
                self.engine.abort_request(rid)
            self._snapshot()
            self._fail_all(exc)
            return
        self._snapshot()
        batches: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, RequestOutput]]] = {}
        for out in outputs:
            route = self._routes.get(out.request_id)
            if route is None:  # aborted meanwhile
                continue
            if out.finished:
                del self._routes[out.request_id]
            batches.setdefault(route[0], []).append((route[1], out))
        for loop, items in batches.items():  # one wake-up of each loop per step, not one per output
            loop.call_soon_threadsafe(_deliver, items)

    def _snapshot(self) -> None:
        """Publish the engine's metrics (read by /metrics on the event loop) and the token rate."""
        m = self.engine.metrics()
        now = time.monotonic()
        self._rate_samples.append((now, m.generation_tokens_total))
        while len(self._rate_samples) > 2 and now - self._rate_samples[1][0] >= self._rate_window_s:
            self._rate_samples.popleft()
        t0, n0 = self._rate_samples[0]
        self.tokens_per_s = (m.generation_tokens_total - n0) / (now - t0) if now > t0 else 0.0
        self.metrics_snapshot = m

    def _abort_all(self) -> None:
        for rid in list(self._routes):
            self.engine.abort_request(rid)
        self._fail_all(EngineDead("the server is shutting down"))

    def _fail_all(self, exc: BaseException) -> None:
        for loop, stream in {id(st): (lp, st) for lp, st in self._routes.values()}.values():
            loop.call_soon_threadsafe(stream.outputs.put_nowait, exc)
        self._routes.clear()


def _check_admitted(max_admitted: int) -> None:
    if max_admitted < 1:
        raise ValueError(f"AsyncEngine: max_admitted must be >= 1, got {max_admitted}")


def name_os_thread(name: str) -> None:
    """Give the calling thread `name` (its first 15 bytes) as its OS-level name, where the kernel keeps one
    (Linux: `top -H`, `ps -L`, /proc/<pid>/task/<tid>/comm), so a per-thread CPU split of `keel serve` tells
    the engine thread from the event loop and the OpenMP workers. Elsewhere (or without prctl) nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _deliver(items: list[tuple[RequestStream, RequestOutput]]) -> None:
    for stream, out in items:
        if out.finished:
            stream._engine_done(out.request_id)
        if not stream.closed:
            stream.outputs.put_nowait(out)


def _resolve(fut: asyncio.Future, exc: BaseException | None) -> None:
    if fut.done():  # the caller was cancelled meanwhile
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)
