"""keel.sandbox.WorkerPool: each limit ends a job (and only its worker), a killed worker is replaced, a job
whose caller gives up stops, and a queue of jobs past their deadline never runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.sandbox import Abandoned, Busy, JobFailed, LimitExceeded, WorkerLimits, WorkerPool

JOBS = Path(__file__).with_name("jobs.py")


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    p = WorkerPool("test", JOBS, {"greeting": "hello"}, workers=1, limits=WorkerLimits(memory_mib=128, cpu_s=1.0))
    yield p
    p.close()


def echo(pool: WorkerPool) -> dict:
    return pool.call({"op": "echo", "value": 1}, run_s=30)


def test_a_job_runs_in_a_worker_set_up_with_its_init(pool):
    got = echo(pool)
    assert got["echo"] == 1 and got["greeting"] == "hello" and got["pid"] in pool.pids()


def test_the_handlers_refusal_is_a_job_failure_and_the_worker_lives(pool):
    pid = echo(pool)["pid"]
    with pytest.raises(JobFailed, match="no such op"):
        pool.call({"op": "nope"}, run_s=30)
    assert echo(pool)["pid"] == pid


def test_past_its_time_a_job_is_killed_and_the_next_job_gets_a_fresh_worker(pool):
    pid, killed = echo(pool)["pid"], pool.num_killed
    t0 = time.monotonic()
    with pytest.raises(LimitExceeded, match="limit of 0.5 s") as info:
        pool.call({"op": "sleep", "s": 60}, run_s=0.5)
    assert info.value.limit == "time" and time.monotonic() - t0 < 10
    assert pool.num_killed == killed + 1
    assert echo(pool)["pid"] != pid


def test_past_its_memory_a_job_fails_naming_the_limit(pool):
    with pytest.raises(LimitExceeded, match="128 MiB") as info:
        pool.call({"op": "allocate", "mib": 1024}, run_s=30)
    assert info.value.limit == "memory"
    assert echo(pool)["echo"] == 1


@pytest.mark.slow  # a second or two of CPU time spent on purpose
def test_past_its_cpu_time_a_job_is_ended_by_the_kernel(pool):
    with pytest.raises(LimitExceeded, match="CPU time") as info:
        pool.call({"op": "spin", "s": 30}, run_s=60)
    assert info.value.limit == "cpu"
    assert echo(pool)["echo"] == 1


def test_a_recursion_past_pythons_limit_is_the_inputs_fault(pool):
    with pytest.raises(JobFailed, match="nests too deeply"):
        pool.call({"op": "deep", "n": 1_000_000}, run_s=30)
    assert echo(pool)["echo"] == 1


def test_a_cancelled_running_job_stops_at_once():
    p = WorkerPool("cancel", JOBS, workers=1, limits=WorkerLimits(memory_mib=128, cpu_s=60))
    try:
        pid = p.call({"op": "echo"}, run_s=30)["pid"]
        fut = p.submit({"op": "sleep", "s": 60}, run_s=60)
        deadline = time.monotonic() + 10
        while p._running.get(0, (None, None))[1] is None and time.monotonic() < deadline:
            time.sleep(0.01)
        p.cancel(fut)
        with pytest.raises(Abandoned):
            fut.result(10)
        assert p.num_killed == 1
        assert p.call({"op": "echo"}, run_s=30)["pid"] != pid
    finally:
        p.close()


def test_jobs_past_their_deadline_in_the_queue_never_run_and_a_later_job_does():
    p = WorkerPool("queue", JOBS, workers=1, limits=WorkerLimits(memory_mib=128, cpu_s=60))
    try:
        p.call({"op": "echo"}, run_s=30)
        now = time.monotonic()
        slow = p.submit({"op": "sleep", "s": 60}, run_s=1.0)
        queued = [p.submit({"op": "sleep", "s": 60}, run_s=60, deadline=now + 0.5) for _ in range(6)]
        with pytest.raises(LimitExceeded):
            slow.result(30)
        for fut in queued:
            with pytest.raises(Busy):
                fut.result(30)
        assert p.num_killed == 1  # the queued ones did not start
        assert p.call({"op": "echo", "value": 2}, run_s=30)["echo"] == 2
    finally:
        p.close()


def test_more_pending_jobs_than_allowed_is_busy_at_once():
    p = WorkerPool("full", JOBS, workers=1, max_pending=2)
    try:
        futs = [p.submit({"op": "sleep", "s": 60}, run_s=60)]
        deadline = time.monotonic() + 10
        while p.pending and time.monotonic() < deadline:  # the first one runs
            time.sleep(0.01)
        futs += [p.submit({"op": "sleep", "s": 60}, run_s=60) for _ in range(2)]
        with pytest.raises(Busy, match="2 jobs wait"):
            p.submit({"op": "sleep", "s": 60}, run_s=60)
        for fut in futs:
            p.cancel(fut)
        assert p.pending == 0
    finally:
        p.close()


def test_an_event_loop_caller_that_is_cancelled_cancels_its_job(pool):
    killed = pool.num_killed

    async def main() -> None:
        task = asyncio.ensure_future(pool.run({"op": "sleep", "s": 60}, run_s=60))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    deadline = time.monotonic() + 10
    while pool.num_killed == killed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.num_killed == killed + 1
    assert echo(pool)["echo"] == 1


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="memory_mib"):
        WorkerLimits(memory_mib=1)
    with pytest.raises(ValueError, match="workers"):
        WorkerPool("none", JOBS, workers=0)
