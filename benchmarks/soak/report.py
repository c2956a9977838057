"""The figures and goals of a soak run of benchmarks/soak/serve.py, and its summary table
(docs/measurements/2026-12-01-soak.md)."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from traffic import ALLOWED, FAILURES


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def pct(values: list[float], q: int) -> float | None:
    """The q-th percentile (inclusive method), or None without values."""
    if not values:
        return None
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def summarize(soak: Any, state: dict[str, Any], log_text: str) -> dict[str, Any]:
    """Figures and goals of a finished run (`soak` is a soak_serve.Soak: its outcomes, samples and bursts)."""
    a, samples, start, idle = soak.args, soak.samples, state["start"], state["idle"]
    counts = Counter(o.outcome for o in soak.outcomes)
    by_kind: dict[str, Counter] = {}
    for o in soak.outcomes:
        by_kind.setdefault(o.kind, Counter())[o.outcome] += 1
    done = [o for o in soak.outcomes if o.outcome == "completed"]
    ttft = [o.ttft_s for o in done if o.ttft_s is not None]
    rss = [(s["t"], s["vmrss"]) for s in samples if "vmrss" in s]
    figures: dict[str, Any] = {
        "requests": len(soak.outcomes),
        "outcomes": dict(counts),
        "latency_p50_s": pct([o.latency_s for o in done], 50),
        "latency_p99_s": pct([o.latency_s for o in done], 99),
        "ttft_p50_s": pct(ttft, 50),
        "latency_p50_p99_s_by_kind": {
            k: (pct(v, 50), pct(v, 99)) for k in sorted(by_kind) if (v := [o.latency_s for o in done if o.kind == k])
        },
        "ttft_p99_s": pct(ttft, 99),
        "max_kv_blocks_used": max((s.get("kv_cache_blocks_used", 0) for s in samples), default=0),
        "kv_blocks_total": state["after"].get("keel_kv_cache_blocks_total"),
        "max_running": max((s.get("num_requests_running", 0) for s in samples), default=0),
        "max_waiting": max((s.get("num_requests_waiting", 0) for s in samples), default=0),
        "preemptions": state["after"]["vllm:num_preemptions_total"] - state["before"]["vllm:num_preemptions_total"],
        "generation_tokens": state["after"]["vllm:generation_tokens_total"]
        - state["before"]["vllm:generation_tokens_total"],
        "metrics_errors": sum(1 for s in samples if "metrics_error" in s),
        "idle_after_s": idle["idle_after_s"],
        "bursts": soak.bursts,
        "server_tracebacks": log_text.count("Traceback"),
        "load1_median": statistics.median(s["load1"] for s in samples) if samples else None,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
    }
    goals: dict[str, bool] = {
        "every request ended in an allowed outcome": not any(counts[f] for f in FAILURES),
        "KV blocks, running and waiting back to 0 when idle": bool(idle["idle"]),
        "no traceback in the server log": figures["server_tracebacks"] == 0,
        "exercised preemption": figures["preemptions"] > 0,
        "exercised 503 (bursts over the admission bound)": counts["503"] > 0 or not soak.bursts,
        "exercised client aborts and 4xx": counts["client_aborted"] > 0 and counts["4xx"] > 0,
    }
    if rss:
        warm = [v for t, v in rss if a.warmup - 5 <= t <= a.warmup + 5] or [rss[0][1]]
        tail = [v for t, v in rss if t >= rss[-1][0] - max(10.0, 0.05 * a.duration)]
        growth = max(tail) / max(warm) - 1
        figures |= {"rss_start_mib": start["vmrss"] / 1024, "rss_after_warmup_mib": max(warm) / 1024}
        figures |= {"rss_end_mib": max(tail) / 1024, "rss_idle_mib": idle["vmrss"] / 1024, "rss_growth": growth}
        figures |= {"rss_peak_mib": idle["vmhwm"] / 1024, "fds_start": start["fds"], "fds_idle": idle["fds"]}
        figures |= {"fd_kinds_start": start["fd_kinds"], "fd_kinds_idle": idle["fd_kinds"]}
        figures |= {"fds_max": max(s["fds"] for s in samples if "fds" in s), "threads": idle["threads"]}
        goals[f"RSS grew < {a.max_rss_growth:.0%} after warm-up"] = growth < a.max_rss_growth
        goals["open fds back to their start when idle"] = idle["fds"] <= start["fds"] + a.fd_slack
    failures = [dataclasses.asdict(o) for o in soak.outcomes if o.outcome not in ALLOWED][:50]
    by_kind_plain = {k: dict(v) for k, v in sorted(by_kind.items())}
    return {"figures": figures, "goals": goals, "by_kind": by_kind_plain, "failures": failures}


def print_summary(result: dict[str, Any]) -> None:
    f = result["figures"]
    print(f"{f['requests']} requests; outcomes: {json.dumps(f['outcomes'])}")
    print(f"  {'kind':<18} {'p50 s':>7} {'p99 s':>7}  outcomes")
    for kind, c in result["by_kind"].items():
        p50, p99 = f["latency_p50_p99_s_by_kind"].get(kind, (None, None))
        lat = f"{p50:7.3f} {p99:7.3f}" if p50 is not None else f"{'-':>7} {'-':>7}"
        print(f"  {kind:<18} {lat}  {json.dumps(c)}")
    skip = ("outcomes", "bursts", "requests", "latency_p50_p99_s_by_kind")
    for key in [k for k in f if k not in skip]:
        v = f[key]
        print(f"  {key:<22} {v:.3f}" if isinstance(v, float) else f"  {key:<22} {v}")
    print(f"  bursts: {json.dumps(f['bursts'])}")
    for o in result["failures"][:10]:
        print(f"  FAILED {o['kind']}: {o['outcome']} (status {o['status']}) {o['detail']}")
    for goal, ok in result["goals"].items():
        print(f"{'PASS' if ok else 'FAIL'}  {goal}")
