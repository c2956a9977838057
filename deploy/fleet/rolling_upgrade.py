#!/usr/bin/env python
"""A rolling torch upgrade of a serving fleet, under load: N `keel serve` replicas behind HAProxy, continuous
streaming traffic, and the replicas restarted one at a time from torch A to torch B with the same keel files.

    .venv/bin/python deploy/fleet/rolling_upgrade.py                     # 3 replicas, torch A (.venv) -> 2.14.1
    .venv/bin/python deploy/fleet/rolling_upgrade.py --replicas 2 --before 10 --after 10 --json roll.json

1. `keel-audit preflight keel --torch B` against the candidate before any replica is touched: a torch the
   preflight refuses stops the roll with nothing changed (exit 2);
2. environment B = a copy of A with only torch replaced (keel's installed files hashed in both: equal);
3. N replicas on A (`--model`, default keel's demo model), HAProxy in front (active checks of `/v1/models`,
   `retry-on 503`, redispatch), `--clients` streaming clients for `--before` seconds;
4. the roll: each replica in turn gets SIGTERM (keel serve answers 503 to new work, finishes what runs),
   exits, restarts on B, becomes ready (`/v1/models`), goes back in; then `--after` seconds of traffic;
5. the report: requests sent / completed / failed, TTFT and latency p50 / p99 before, during and after the
   roll, each replica's torch (from /metrics), and the greedy answers of each replica on A and on B.
Exit 0 when no request failed, p99 latency during the roll is within 2x of before, and A's and B's answers
are equal.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fleet import HAProxy, Replica, Traffic, keel_files_digest, make_env_b, phase_rows, roll

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "The capital of France is"


def preflight(venv: Path, torch_b: str) -> tuple[bool, str]:
    """keel-audit preflight of the installed keel against torch B (downloaded as a wheel, never installed)."""
    exe = venv / "bin" / "keel-audit"
    if not exe.exists():
        return False, f"{exe} is missing: pip install ./audit into {venv}"
    # cwd /: in the checkout, "keel" would name the source folder (no libraries), not the installed distribution
    proc = subprocess.run([str(exe), "preflight", "keel", "--torch", torch_b], capture_output=True, text=True, cwd="/")
    last = (proc.stdout.strip().splitlines() or [proc.stderr.strip()])[-1]
    found = re.search(r"(\d+) of (\d+) libraries load", last)
    if found is None or int(found.group(2)) == 0:  # nothing was checked: no verdict, so no roll
        return False, f"no keel library was preflighted: {last}"
    return proc.returncode == 0, last


def greedy(replicas: list[Replica], model: str) -> list[str]:
    return [Traffic(r.url, model, max_tokens=12).one(QUESTION, temperature=0.0, stream=False).text for r in replicas]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--venv", type=Path, default=ROOT / ".venv", help="environment A (keel installed)")
    p.add_argument("--venv-b", type=Path, default=ROOT / ".venv-roll-b", help="environment B (made from A)")
    p.add_argument("--torch-b", default="2.14.1")
    p.add_argument("--model", default="keel/SmolLM2-135M-Instruct-Q4_1", help="what the replicas serve")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--before", type=float, default=20.0, help="seconds of traffic before the roll")
    p.add_argument("--after", type=float, default=20.0, help="seconds of traffic after the roll")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    a_py, b_py = str(a.venv / "bin" / "python"), str(a.venv_b / "bin" / "python")

    ok, why = preflight(a.venv, a.torch_b)
    print(f"preflight against torch {a.torch_b}: {'loads' if ok else 'REFUSED'}: {why}", flush=True)
    if not ok:
        print("ROLL REFUSED: nothing was changed")
        return 2
    make_env_b(a.venv, a.venv_b, a.torch_b)
    files_a, files_b = keel_files_digest(a_py), keel_files_digest(b_py)
    work = Path(tempfile.mkdtemp(prefix="keel-roll-"))
    replicas = [
        Replica(a_py, a.model, port, ["--shutdown-timeout", "60"], log=work / f"replica{i}.log")
        for i, port in enumerate(_ports(a.replicas))
    ]
    lb = HAProxy([r.port for r in replicas], work)
    for r in replicas:
        r.start()
    for r in replicas:
        r.wait_ready()
    answers_a = greedy(replicas, a.model)
    torch_a = [r.torch() for r in replicas]
    lb.start()
    traffic = Traffic(lb.url, a.model, clients=a.clients, max_tokens=a.max_tokens)
    traffic.start()
    time.sleep(a.before)
    t_roll = time.monotonic()
    events = roll(replicas, b_py, lb)
    t_done = time.monotonic()
    time.sleep(a.after)
    traffic.stop()
    answers_b = greedy(replicas, a.model)
    torch_b = [r.torch() for r in replicas]
    lb.stop()
    for r in replicas:
        r.drain()
    rows = phase_rows(traffic.results, (t_roll, t_done))
    print(f"\n{a.replicas} replicas, {a.clients} streaming clients, {a.max_tokens} tokens each; logs in {work}")
    print("| phase | sent | completed | failed | TTFT p50 / p99 ms | latency p50 / p99 ms |")
    print("|---|---:|---:|---:|---|---|")
    for row in rows:
        print(
            f"| {row['phase']} | {row['sent']} | {row['completed']} | {row['failed']} | "
            f"{row['ttft_p50_ms']:.0f} / {row['ttft_p99_ms']:.0f} | {row['latency_p50_ms']:.0f} / "
            f"{row['latency_p99_ms']:.0f} |"
        )
    print("\n| replica | torch before | torch after | drain s | ready on B s | greedy answer equal |")
    print("|---|---|---|---:|---:|---|")
    for i, ev in enumerate(events):
        same = answers_a[i] == answers_b[i]
        print(f"| :{ev['port']} | {torch_a[i]} | {torch_b[i]} | {ev['drain_s']:.1f} | {ev['ready_s']:.1f} | {same} |")
    failed = sum(row["failed"] for row in rows)
    before, during = rows[0], rows[1]
    checks = {
        f"keel files identical in A and B ({len(files_a)} files)": files_a == files_b and bool(files_a),
        "every replica on torch B": all(t.split("+")[0] == a.torch_b for t in torch_b),
        "0 failed requests": failed == 0,
        "p99 latency during the roll within 2x of before": during["latency_p99_ms"] <= 2 * before["latency_p99_ms"],
        "greedy answers equal on A and B": answers_a == answers_b,
        "clean exits": all(ev["exit"] == 0 for ev in events),
    }
    for name, passed in checks.items():
        print(f"  {'ok  ' if passed else 'FAIL'} {name}")
    for r in traffic.results:
        if not r.ok:
            print(f"  failed request: status {r.status} {r.error}")
    if a.json:
        a.json.write_text(json.dumps({"phases": rows, "events": events, "checks": checks}, indent=1))
    ok = all(checks.values())
    print("ROLL PASSED" if ok else "ROLL FAILED")
    return 0 if ok else 1


def _ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


if __name__ == "__main__":
    sys.exit(main())
