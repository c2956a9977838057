"""Server-side request statistics and their Prometheus text rendering (`GET /metrics`).

Written by hand in the Prometheus text exposition format (version 0.0.4): a few gauges from the
engine's own metrics, counters, and cumulative histograms of time to first token and request latency.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from keel import __version__ as keel_version

if TYPE_CHECKING:
    from keel.engine.async_engine import AsyncEngine

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0)


@dataclass(slots=True)
class Histogram:
    """A cumulative histogram with fixed upper bounds, as Prometheus exposes them."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {running}')
        out += [f"{name}_sum{{{labels}}} {self.total!r}", f"{name}_count{{{labels}}} {self.n}"]
        return out


@dataclass(slots=True)
class ServerStats:
    """What the HTTP layer counts (event-loop side only)."""

    ttft_s: Histogram = field(default_factory=lambda: Histogram(_TTFT_BUCKETS))
    e2e_s: Histogram = field(default_factory=lambda: Histogram(_LATENCY_BUCKETS))
    itl_s: Histogram = field(default_factory=lambda: Histogram(_ITL_BUCKETS))
    finished: Counter = field(default_factory=Counter)  # finish_reason -> sub-requests


def render_prometheus(model: str, engine: AsyncEngine[Any], stats: ServerStats) -> str:
    """The whole `/metrics` page: the engine's metrics (as of its last step), its admission counters and
    token rate, and the HTTP layer's statistics."""
    m, lab = engine.metrics_snapshot, f'model_name="{_escape(model)}"'
    tokens_per_s = engine.tokens_per_s
    lines: list[str] = []
    lines += [
        "# HELP keel_build_info keel and the torch it runs on (the same wheel serves several torch releases).",
        "# TYPE keel_build_info gauge",
        f'keel_build_info{{{lab},keel_version="{keel_version}",torch_version="{torch.__version__}"}} 1',
    ]

    def metric(name: str, kind: str, help_: str, value: float, labels: str = lab) -> None:
        lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {value}"])

    metric("keel_num_requests_running", "gauge", "Requests in the running batch.", m.num_running)
    metric("keel_num_requests_waiting", "gauge", "Requests waiting to be scheduled.", m.num_waiting)
    metric("keel_kv_cache_blocks_used", "gauge", "KV cache blocks held by requests.", m.kv_blocks_used)
    metric("keel_kv_cache_blocks_total", "gauge", "KV cache blocks in the pool.", m.kv_blocks_total)
    metric(
        "keel_kv_cache_usage_ratio",
        "gauge",
        "Fraction of KV cache blocks in use.",
        m.kv_blocks_used / m.kv_blocks_total if m.kv_blocks_total else 0.0,
    )
    metric(
        "keel_generation_tokens_per_second",
        "gauge",
        "Output tokens per second over the last seconds.",
        round(tokens_per_s, 3),
    )
    metric("keel_prompt_tokens_total", "counter", "Prompt tokens processed.", m.prompt_tokens_total)
    metric("keel_generation_tokens_total", "counter", "Tokens generated.", m.generation_tokens_total)
    metric("keel_num_preemptions_total", "counter", "Requests preempted back to waiting.", m.num_preemptions)
    metric(
        "keel_prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        m.prefix_cache_queries,
    )
    metric("keel_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", m.prefix_cache_hits)
    metric(
        "keel_request_aborted_total", "counter", "Requests aborted (client disconnected or error).", engine.num_aborted
    )
    metric(
        "keel_num_requests_admitted",
        "gauge",
        "Sub-requests holding an admission slot (not yet finished by the engine nor closed).",
        getattr(engine, "num_admitted", engine.num_open),
    )
    metric("keel_num_streams_open", "gauge", "Sub-requests whose response is still being sent.", engine.num_open)
    metric(
        "keel_request_rejected_total",
        "counter",
        "Requests refused because the server was overloaded.",
        engine.num_rejected,
    )
    lines += [
        "# HELP keel_request_success_total Requests finished, by finish reason.",
        "# TYPE keel_request_success_total counter",
    ]
    for reason in ("stop", "length"):
        lines.append(f'keel_request_success_total{{{lab},finished_reason="{reason}"}} {stats.finished[reason]}')
    for name, help_, hist in (
        ("keel_time_to_first_token_seconds", "Time from request arrival to its first token.", stats.ttft_s),
        ("keel_inter_token_latency_seconds", "Time between two streamed outputs of a request.", stats.itl_s),
        ("keel_e2e_request_latency_seconds", "Time from request arrival to its last token.", stats.e2e_s),
    ):
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} histogram", *hist.lines(name, lab)]
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
