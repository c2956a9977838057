"""What routers and orchestrators read from a replica: `/metrics` with vLLM's names and types (parsed
with prometheus_client's own parser), `/health` as liveness, `/v1/models` as readiness (only once the
engine has run a step), and both 503 while draining."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import torch
from support.serve import MODEL_NAME, Served, start_server

prometheus_parser = pytest.importorskip("prometheus_client.parser")

# name -> type, as vLLM exposes them (llm-d's model-server protocol needs the first three)
VLLM_METRICS = {
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}


def _get(url: str) -> tuple[int, dict[str, Any] | str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        body, status = e.read().decode(), e.code
    try:
        return status, json.loads(body)
    except json.JSONDecodeError:
        return status, body


def _families(served: Served) -> dict[str, Any]:
    text = urllib.request.urlopen(served.base_url + "/metrics", timeout=10).read().decode()
    return {f.name: f for f in prometheus_parser.text_string_to_metric_families(text)}


def _complete(served: Served, max_tokens: int = 4) -> int:
    """One completion; returns how many tokens it generated."""
    req = urllib.request.Request(
        served.base_url + "/v1/completions",
        data=json.dumps({"model": MODEL_NAME, "prompt": "Hello there", "max_tokens": max_tokens}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
        return int(json.loads(r.read())["usage"]["completion_tokens"])


def test_metrics_have_vllm_names_and_types(served: Served) -> None:
    generated = _complete(served)
    families = _families(served)
    for name, kind in VLLM_METRICS.items():
        assert name in families, f"/metrics lacks {name}"
        assert families[name].type == kind, f"{name} is a {families[name].type}, vLLM's is a {kind}"
        for sample in families[name].samples:
            if name != "vllm:cache_config_info":
                assert sample.labels.get("model_name") == MODEL_NAME and sample.labels.get("engine") == "0", sample
    usage = families["vllm:kv_cache_usage_perc"].samples[0].value
    assert 0.0 <= usage <= 1.0  # a fraction, as in vLLM (despite the name)
    info = families["vllm:cache_config_info"].samples[0].labels
    assert int(info["block_size"]) > 0 and int(info["num_gpu_blocks"]) > 0
    assert generated >= 1 and families["vllm:generation_tokens"].samples[0].value >= generated
    ttft = {s.name: s.value for s in families["vllm:time_to_first_token_seconds"].samples if not s.labels.get("le")}
    assert ttft["vllm:time_to_first_token_seconds_count"] >= 1
    build = families["keel_build_info"].samples[0].labels
    assert build["torch_version"] == torch.__version__


def test_metrics_name_no_path_beyond_the_served_name(served: Served) -> None:
    text = urllib.request.urlopen(served.base_url + "/metrics", timeout=10).read().decode()
    families = prometheus_parser.text_string_to_metric_families(text)
    names = {s.labels.get("model_name") for f in families for s in f.samples} - {None}
    assert names == {MODEL_NAME}


def test_models_is_readiness_only_after_the_engine_stepped(tiny_model: Any) -> None:
    served = start_server(tiny_model, require_warm_up=True)
    try:
        llm = served.engine.engine
        original, stepped = llm.step, []

        def counted() -> Any:
            stepped.append(1)
            return original()

        llm.step = counted
        assert served.engine.steps == 0
        assert _get(served.base_url + "/health")[0] == 200  # liveness: the process and its engine thread are up
        status, body = _get(served.base_url + "/v1/models")
        assert status == 503 and isinstance(body, dict) and body["error"]["code"] == "not_ready", body
        deadline = time.monotonic() + 30
        while status != 200 and time.monotonic() < deadline:  # the first probe started the warm-up request
            time.sleep(0.05)
            status, body = _get(served.base_url + "/v1/models")
        assert status == 200, body
        assert stepped and served.engine.steps >= 1, "ready although the engine never ran a step"
    finally:
        served.stop()


def test_not_ready_until_a_step_ran(tiny_model: Any) -> None:
    from keel.entrypoints.openai.readiness import is_ready

    served = start_server(tiny_model, require_warm_up=True)
    try:
        app = served.thread.server.config.app.app  # the FastAPI app inside the Guard
        app.state.warm_up = "held"  # a warm-up that never runs: only a real step may make the replica ready
        for _ in range(3):
            status, body = _get(served.base_url + "/v1/models")
            assert status == 503 and isinstance(body, dict) and body["error"]["code"] == "not_ready"
        assert not is_ready(app)
        _complete(served, max_tokens=1)  # any request's step proves the engine
        assert _get(served.base_url + "/v1/models")[0] == 200
    finally:
        served.stop()
