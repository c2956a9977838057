"""A pytest plugin for one area of the device check (scripts/device/check.py area): standard library only.

- Every test's result is appended to $KEEL_AREA_RESULTS (JSON lines) as soon as it is known, so a process that is
  killed still leaves the verdicts of the tests it finished, and the test it was in (a "started" line).
- Per-test timeout ($KEEL_TEST_TIMEOUT s): SIGALRM raises in the test; a test stuck in native code past the
  timeout + 15 s is recorded as failed ("timeout") and the process exits, and the caller restarts the area.
- A sticky CUDA fault (an illegal address, a device-side assert in this process): the test is recorded failed and
  the session stops after it; the caller restarts the area in a fresh process (a fresh CUDA context).
- Tests already recorded in $KEEL_AREA_RESULTS are deselected, so a restart runs only the rest.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

STICKY = (
    "device-side assert",
    "illegal memory access",
    "an illegal instruction",
    "misaligned address",
    "unspecified launch failure",
    "CUDA error: an illegal",
    "cudaErrorIllegalAddress",
    "cudaErrorLaunchFailure",
    "cudaErrorAssert",
)
_RESULTS = os.environ.get("KEEL_AREA_RESULTS", "")
_TIMEOUT = float(os.environ.get("KEEL_TEST_TIMEOUT", "0") or 0)
_GRACE = 15.0
_lock = threading.Lock()
_current: dict[str, float | str] = {}


def _record(**row: object) -> None:
    if not _RESULTS:
        return
    with _lock, open(_RESULTS, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _done_ids() -> set[str]:
    if not _RESULTS or not os.path.isfile(_RESULTS):
        return set()
    done = set()
    with open(_RESULTS) as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row.get("outcome") in ("passed", "failed", "skipped"):
                done.add(row["nodeid"])
    return done


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    done = _done_ids()
    if not done:
        return
    keep = [it for it in items if it.nodeid not in done]
    config.hook.pytest_deselected(items=[it for it in items if it.nodeid in done])
    items[:] = keep


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Timeout(f"the test ran past the per-test timeout of {_TIMEOUT:.0f} s")


def _watchdog() -> None:
    """Ends the process when a test is stuck where SIGALRM cannot reach it (native code)."""
    while True:
        time.sleep(1.0)
        with _lock:
            nodeid, t0 = _current.get("nodeid"), _current.get("t0")
        if nodeid and isinstance(t0, float) and time.monotonic() - t0 > _TIMEOUT + _GRACE:
            msg = f"timeout: stuck past {_TIMEOUT:.0f} + {_GRACE:.0f} s (native code); process ended"
            _record(nodeid=nodeid, outcome="failed", duration=time.monotonic() - t0, sticky=True, message=msg)
            os._exit(4)


def pytest_configure(config: pytest.Config) -> None:
    if _TIMEOUT > 0 and hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, _alarm)
        threading.Thread(target=_watchdog, daemon=True).start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _record(nodeid=item.nodeid, outcome="started")
    with _lock:
        _current.update(nodeid=item.nodeid, t0=time.monotonic())
    if _TIMEOUT > 0 and hasattr(signal, "SIGALRM"):
        signal.setitimer(signal.ITIMER_REAL, _TIMEOUT)
    try:
        yield
    finally:
        if _TIMEOUT > 0 and hasattr(signal, "SIGALRM"):
            signal.setitimer(signal.ITIMER_REAL, 0)
        with _lock:
            _current.clear()


_outcomes: dict[str, dict] = {}
_sticky: set[str] = set()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    row = _outcomes.setdefault(report.nodeid, {"nodeid": report.nodeid, "outcome": "passed", "duration": 0.0})
    row["duration"] += report.duration
    if report.failed:
        text = str(report.longrepr or "")
        row["outcome"] = "failed"
        crash = getattr(report.longrepr, "reprcrash", None)
        first = crash.message if crash is not None else (text.strip().splitlines() or [""])[-1]
        row.setdefault("message", f"{report.when}: {first}"[:400])
        if report.nodeid in _sticky:
            row["sticky"] = True
    elif report.skipped and row["outcome"] == "passed" and report.when in ("setup", "call"):
        row["outcome"] = "skipped"
        row["message"] = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)[:200]
    if report.when == "teardown":
        _record(**_outcomes.pop(report.nodeid))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> None:
    # a CUDA error raised in this process (not an assertion about a child process's output)
    if call.excinfo is not None and call.when in ("setup", "call") and not call.excinfo.errisinstance(AssertionError):
        text = str(call.excinfo.value)
        if any(s in text for s in STICKY):
            _sticky.add(item.nodeid)
            item.session.shouldstop = f"a sticky CUDA fault in {item.nodeid}: the area restarts in a fresh process"
