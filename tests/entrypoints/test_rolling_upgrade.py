"""A small rolling restart under load, as an orchestrator does it: two `keel serve` processes behind HAProxy
(active readiness checks, retry on 503), streaming clients for a few seconds, each replica drained with
SIGTERM, restarted and put back in turn. No client request may fail. The torch swap itself is
deploy/fleet/rolling_upgrade.py (it needs a second environment); here both generations run this torch."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest
from support.scripts import load_script

fleet = load_script("deploy/fleet/fleet.py")

pytestmark = [
    pytest.mark.slow,  # three `keel serve` starts and two drains
    pytest.mark.skipif(
        shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists(),
        reason="haproxy is not installed (Debian: apt-get install haproxy; .ci/run installs it)",
    ),
]
ARGS = ["--dtype", "float32", "--device", "cpu", "--block-size", "4", "--kv-cache-gib", "0.05"]
ARGS += ["--served-model-name", "m", "--log-level", "warning", "--shutdown-timeout", "30"]


def test_rolling_restart_under_load_fails_no_request(tiny_model: Path, tmp_path: Path) -> None:
    ports = [fleet._free_port() for _ in range(2)]
    replicas = [fleet.Replica(sys.executable, str(tiny_model), p, ARGS, log=tmp_path / f"r{p}.log") for p in ports]
    lb = fleet.HAProxy(ports, tmp_path)
    traffic = fleet.Traffic(lb.url, "m", clients=3, max_tokens=24)
    try:
        for r in replicas:
            r.start()
        for r in replicas:
            r.wait_ready(120)
        lb.start()
        traffic.start()
        time.sleep(2.0)
        t_roll = time.monotonic()
        events = fleet.roll(replicas, sys.executable, lb, log=lambda *_: None)
        t_done = time.monotonic()
        deadline = t_done + 60
        while not any(r.start >= t_done for r in traffic.results) and time.monotonic() < deadline:
            time.sleep(0.1)  # traffic after the roll: at least one request sent and answered
    finally:
        traffic.stop()
        lb.stop()
        for r in replicas:
            if r.proc is not None and r.proc.poll() is None:
                r.drain(30)
    rows = fleet.phase_rows(traffic.results, (t_roll, t_done))
    failed = [(r.status, r.error) for r in traffic.results if not r.ok]
    assert not failed, f"{len(failed)} of {len(traffic.results)} requests failed during the roll: {failed[:5]}"
    assert all(row["sent"] > 0 for row in rows), rows  # traffic before, during and after the roll
    assert [ev["exit"] for ev in events] == [0, 0]  # each replica drained and exited cleanly
