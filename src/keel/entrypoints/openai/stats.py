"""Server-side request statistics and `GET /metrics`, rendered by `prometheus_client`.

The names and meanings are vLLM's (`vllm:num_requests_running`, `vllm:kv_cache_usage_perc`,
`vllm:time_to_first_token_seconds`, ...), because the routers and dashboards that schedule
OpenAI-style replicas (llm-d's endpoint picker, vLLM's production-stack router, Grafana boards) read
those. keel keeps its own `keel_*` names only for what vLLM has no metric for (the build info with the
torch release, KV blocks in use, aborted and refused requests, the recent token rate).
Labels: `model_name` (the served name) and `engine` ("0": one engine per replica), as vLLM sets them.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from keel import __version__ as keel_version

if TYPE_CHECKING:
    from keel.engine.async_engine import AsyncEngine

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# vLLM's buckets for the same histograms, so dashboards built for vLLM read keel's the same way
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
FINISH_REASONS = ("stop", "length", "abort", "error")


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

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out


@dataclass(slots=True)
class ServerStats:
    """What the HTTP layer counts (event-loop side only)."""

    ttft_s: Histogram = field(default_factory=lambda: Histogram(_TTFT_BUCKETS))
    e2e_s: Histogram = field(default_factory=lambda: Histogram(_LATENCY_BUCKETS))
    itl_s: Histogram = field(default_factory=lambda: Histogram(_ITL_BUCKETS))
    finished: Counter = field(default_factory=Counter)  # finish_reason -> sub-requests


class _ServerCollector(Collector):
    """Reads the engine's last metrics snapshot and the HTTP layer's statistics at scrape time."""

    def __init__(self, model: str, engine: AsyncEngine[Any], stats: ServerStats, block_size: int) -> None:
        self.model, self.engine, self.stats, self.block_size = model, engine, stats, block_size

    def collect(self) -> Iterator[Metric]:
        m, eng, stats = self.engine.metrics_snapshot, self.engine, self.stats
        names, values = ["model_name", "engine"], [self.model, "0"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(values, value)
            return c

        build = GaugeMetricFamily(
            "keel_build_info",
            "keel and the torch it runs on (the same wheel serves several torch releases).",
            labels=[*names, "keel_version", "torch_version"],
        )
        build.add_metric([*values, keel_version, torch.__version__], 1)
        yield build
        cache = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the KV cache configuration.",
            labels=["block_size", "num_gpu_blocks"],
        )
        cache.add_metric([str(self.block_size), str(m.kv_blocks_total)], 1)
        yield cache
        yield gauge("vllm:num_requests_running", "Number of requests in the running batch.", m.num_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be scheduled.", m.num_waiting)
        usage = m.kv_blocks_used / m.kv_blocks_total if m.kv_blocks_total else 0.0
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage: the fraction of blocks in use (1 = 100%).", usage)
        yield gauge("keel_kv_cache_blocks_used", "KV cache blocks held by requests.", m.kv_blocks_used)
        yield gauge("keel_kv_cache_blocks_total", "KV cache blocks in the pool.", m.kv_blocks_total)
        yield gauge(
            "keel_generation_tokens_per_second", "Output tokens per second over the last seconds.", eng.tokens_per_s
        )
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", m.prompt_tokens_total)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", m.generation_tokens_total)
        yield counter("vllm:num_preemptions", "Cumulative number of preemptions from the engine.", m.num_preemptions)
        yield counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", m.prefix_cache_queries
        )
        yield counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", m.prefix_cache_hits)
        yield counter("keel_request_aborted", "Requests aborted (client disconnected or error).", eng.num_aborted)
        yield gauge(
            "keel_num_requests_admitted",
            "Sub-requests holding an admission slot (not yet finished by the engine nor closed).",
            getattr(eng, "num_admitted", eng.num_open),
        )
        yield gauge("keel_num_streams_open", "Sub-requests whose response is still being sent.", eng.num_open)
        yield counter("keel_request_rejected", "Requests refused because the server was overloaded.", eng.num_rejected)
        success = CounterMetricFamily(
            "vllm:request_success", "Count of finished requests, by finish reason.", labels=[*names, "finished_reason"]
        )
        for reason in FINISH_REASONS:
            success.add_metric([*values, reason], stats.finished[reason])
        yield success
        for name, doc, hist in (
            ("vllm:time_to_first_token_seconds", "Time from request arrival to its first token.", stats.ttft_s),
            ("vllm:inter_token_latency_seconds", "Time between two streamed outputs of a request.", stats.itl_s),
            ("vllm:e2e_request_latency_seconds", "Time from request arrival to its last token.", stats.e2e_s),
        ):
            h = HistogramMetricFamily(name, doc, labels=names)
            h.add_metric(values, hist.buckets(), sum_value=hist.total)
            yield h


def metrics_registry(model: str, engine: AsyncEngine[Any], stats: ServerStats, block_size: int) -> CollectorRegistry:
    """A registry of its own per app (never prometheus_client's global one: tests run several apps in one
    process), holding the one collector that reads this server's state at scrape time."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ServerCollector(model, engine, stats, block_size))
    return registry


def render_prometheus(registry: CollectorRegistry) -> bytes:
    """The whole `/metrics` page in Prometheus' text format 0.0.4."""
    return generate_latest(registry)
