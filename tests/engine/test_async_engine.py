"""`AsyncEngine` drives anything with `LLMEngine`'s request API (the `SyncEngine` protocol) from one thread:
outputs reach their stream, the admission bound refuses with `Overloaded`, closing an unfinished stream
aborts it in the engine. A fake engine here: no model, no HTTP."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import pytest

from keel.engine import EngineMetrics, RequestOutput, SamplingParams
from keel.engine.async_engine import AsyncEngine, Overloaded


class CountdownEngine:
    """Each request produces one token per step, as many as its prompt has tokens, then finishes."""

    def __init__(self) -> None:
        self.left: dict[str, int] = {}
        self.aborted: list[str] = []

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None) -> None:
        self.left[request_id] = len(prompt)

    def abort_request(self, request_id: str) -> None:
        if self.left.pop(request_id, None) is not None:
            self.aborted.append(request_id)

    def step(self) -> list[RequestOutput]:
        time.sleep(0.01)
        outs = []
        for rid in list(self.left):
            self.left[rid] -= 1
            done = self.left[rid] == 0
            if done:
                del self.left[rid]
            outs.append(RequestOutput(rid, None, [], "", [], "", [7], done, "length" if done else None, 0, 0.0, 0.0))
        return outs

    def has_unfinished_requests(self) -> bool:
        return bool(self.left)

    def metrics(self) -> EngineMetrics:
        return EngineMetrics(len(self.left), 0, 0, 1, 0, 0, 0, 0, 0)


def test_outputs_admission_and_abort():
    fake = CountdownEngine()
    engine = AsyncEngine(fake, max_admitted=2)

    async def scenario() -> None:
        stream = await engine.open(["a"], [[1, 2, 3]], [SamplingParams()])
        outs = [out async for out in stream]
        stream.close()
        assert [o.finished for o in outs] == [False, False, True] and {o.request_id for o in outs} == {"a"}
        long = await engine.open(["b", "c"], [[1] * 1000, [1] * 1000], [SamplingParams()] * 2)
        with pytest.raises(Overloaded, match="2 requests are in flight and it admits 2"):
            await engine.open(["d"], [[1]], [SamplingParams()])
        assert engine.num_rejected == 1 and engine.num_open == 2
        long.close()  # both unfinished: aborted in the engine, the admission slots freed
        assert engine.num_aborted == 2 and engine.num_open == 0
        for _ in range(500):
            if sorted(fake.aborted) == ["b", "c"]:
                break
            await asyncio.sleep(0.01)
        assert sorted(fake.aborted) == ["b", "c"] and not fake.has_unfinished_requests()

    try:
        asyncio.run(scenario())
    finally:
        engine.shutdown()
    assert not engine.alive and engine.error is None


class ClientRecordingEngine(CountdownEngine):
    """Records the client each request was added for."""

    def __init__(self) -> None:
        super().__init__()
        self.clients: dict[str, str | None] = {}

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        *,
        client: str | None = None,
    ) -> None:
        self.clients[request_id] = client
        super().add_request(request_id, prompt, params)


def test_open_passes_the_client_to_the_engine():
    """The client identity the server gives `open` reaches the engine with every sub-request."""
    fake = ClientRecordingEngine()
    engine = AsyncEngine(fake, max_admitted=4)

    async def scenario() -> None:
        for ids, client in ((["a", "b"], "key-1"), (["c"], None)):
            stream = await engine.open(ids, [[1]] * len(ids), [SamplingParams()] * len(ids), client=client)
            assert len([out async for out in stream]) == len(ids)
            stream.close()

    try:
        asyncio.run(scenario())
    finally:
        engine.shutdown()
    assert fake.clients == {"a": "key-1", "b": "key-1", "c": None}


class CountingEngine(CountdownEngine):
    """Counts generated tokens in its metrics, and is slow to report them (as a busy host can be)."""

    def __init__(self) -> None:
        super().__init__()
        self.generated = 0

    def step(self) -> list[RequestOutput]:
        outs = super().step()
        self.generated += len(outs)
        return outs

    def metrics(self) -> EngineMetrics:
        time.sleep(0.05)  # the event loop gets the outputs meanwhile if they were sent before the metrics
        return EngineMetrics(len(self.left), 0, 0, 1, 0, self.generated, 0, 0, 0)


def test_metrics_count_a_token_before_its_caller_gets_it():
    """A client that reads /metrics right after its response must see its tokens counted."""
    engine = AsyncEngine(CountingEngine(), max_admitted=2)

    async def scenario() -> None:
        stream = await engine.open(["a"], [[1, 2, 3]], [SamplingParams()])
        seen = 0
        async for _ in stream:
            seen += 1
            assert engine.metrics_snapshot.generation_tokens_total >= seen
        stream.close()

    try:
        asyncio.run(scenario())
    finally:
        engine.shutdown()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OS thread names are read from /proc (Linux)")
def test_engine_thread_has_its_os_name():
    """The engine thread is `keel-engine` to the OS (/proc/<pid>/task/<tid>/comm, `top -H`), so a per-thread
    CPU split of `keel serve` tells it from the event loop."""
    engine = AsyncEngine(CountdownEngine(), max_admitted=2)
    try:
        deadline = time.monotonic() + 5
        tid = engine._thread.native_id
        while Path(f"/proc/self/task/{tid}/comm").read_text().strip() != "keel-engine":
            assert time.monotonic() < deadline, "the engine thread never took its OS name"
            time.sleep(0.01)
        assert Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip() != "keel-engine"
    finally:
        engine.shutdown()


class ThreadRecordingEngine(CountdownEngine):
    """Records the thread that built it and every thread that stepped it."""

    def __init__(self) -> None:
        super().__init__()
        self.built_on = threading.get_ident()
        self.stepped_on: set[int] = set()

    def step(self) -> list[RequestOutput]:
        self.stepped_on.add(threading.get_ident())
        return super().step()


def test_start_builds_the_engine_on_the_thread_that_runs_it():
    """`AsyncEngine.start` (what `keel serve` uses) builds the engine on the engine thread, which then steps
    it: one thread, so one OpenMP team in the process (a model loaded on the main thread and run on another
    leaves two, which slows prefill steps: docs/measurements/2026-12-03-prefetch.md)."""
    engine = AsyncEngine.start(ThreadRecordingEngine, max_admitted=2)
    fake = engine.engine

    async def scenario() -> None:
        stream = await engine.open(["a"], [[1, 2]], [SamplingParams()])
        assert [o.finished async for o in stream] == [False, True]
        stream.close()

    try:
        asyncio.run(scenario())
        assert fake.built_on != threading.get_ident()
        assert fake.stepped_on == {fake.built_on} == {engine._thread.ident}
    finally:
        engine.shutdown()
    assert not engine.alive and engine.error is None


def test_start_raises_what_the_build_raises_and_leaves_no_thread():
    def build() -> CountdownEngine:
        raise FileNotFoundError("no model here")

    before = threading.active_count()
    with pytest.raises(FileNotFoundError, match="no model here"):
        AsyncEngine.start(build, max_admitted=2)
    assert threading.active_count() == before
    with pytest.raises(ValueError, match="max_admitted must be >= 1"):
        AsyncEngine.start(CountdownEngine, max_admitted=0)
