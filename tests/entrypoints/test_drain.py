"""Graceful drain of `keel serve` as a process: SIGTERM with a stream in flight. /health turns 503 at once,
new requests get 503, the running stream finishes (or, past --shutdown-timeout, ends with an OpenAI error
chunk and `data: [DONE]`), and the process exits 0."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from keel_dev.server import start_server
from support.serve import needs_ops

pytestmark = needs_ops


class Proc:
    """`keel serve` of `model` (keel_dev.server) with a drain timeout, and the requests this test sends it."""

    def __init__(self, model: Path, shutdown_timeout: float) -> None:
        args = ["--model", str(model), "--dtype", "float32", "--device", "cpu", "--block-size", "4"]
        args += ["--kv-cache-gib", "0.05", "--served-model-name", "m", "--log-level", "warning"]
        self.server = start_server([*args, "--shutdown-timeout", str(shutdown_timeout)], timeout_s=120)
        self.proc, self.base = self.server.proc, self.server.base_url

    def streams_open(self) -> float:
        """`keel_num_streams_open` from /metrics (sub-requests whose response is still being sent)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = urllib.request.urlopen(self.base + "/metrics", timeout=10).read().decode()
        for family in text_string_to_metric_families(text):
            if family.name == "keel_num_streams_open":
                return family.samples[0].value
        return 0.0

    def health(self) -> int | None:
        return self.server.health()

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        req = urllib.request.Request(self.base + path, json.dumps(body).encode(), {"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def stream(self, body: dict, events: list[str], first: threading.Event) -> None:
        """Read an SSE stream line by line into `events` (the raw `data:` payloads)."""
        req = urllib.request.Request(
            self.base + "/v1/chat/completions",
            json.dumps({**body, "stream": True}).encode(),
            {"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    events.append(line[6:])
                    first.set()

    def kill(self) -> None:
        self.server.kill()


# a stream long enough to be in flight at the signal: 8 choices x 48 tokens of the tiny model (seconds here)
LONG = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 48, "n": 8, "ignore_eos": True}


def run_drain(model: Path, shutdown_timeout: float, whole_tokens: int = 48) -> tuple[list[str], dict, int]:
    """A non-streamed request (`whole_tokens` per choice) and a stream in flight, then SIGTERM; what /health, a
    new request, the stream and the non-streamed request got, and the exit status."""
    p = Proc(model, shutdown_timeout)
    try:
        whole: list = []
        body = {**LONG, "max_tokens": whole_tokens}
        sender = threading.Thread(target=lambda: whole.append(p.post("/v1/chat/completions", body)), daemon=True)
        sender.start()
        deadline = time.monotonic() + 60
        while not whole and p.streams_open() < 8 and time.monotonic() < deadline:
            time.sleep(0.02)  # the non-streamed request is in flight (its 8 choices open) before anything else
        events: list[str] = []
        first = threading.Event()
        reader = threading.Thread(target=p.stream, args=(LONG, events, first), daemon=True)
        reader.start()
        assert first.wait(60), "no first chunk"
        p.proc.send_signal(signal.SIGTERM)
        seen = {"health": p.health(), "new": p.post("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2})}
        reader.join(120)
        sender.join(120)
        assert not reader.is_alive() and not sender.is_alive(), "a request did not end"
        seen["whole"] = whole[0]
        return events, seen, p.proc.wait(60)
    finally:
        p.kill()


def test_sigterm_lets_a_running_stream_finish(tiny_model):
    events, seen, code = run_drain(tiny_model, shutdown_timeout=60)
    assert seen["health"] == 503  # at once, while the stream still runs
    status, body = seen["new"]
    assert status == 503 and body["error"]["code"] == "shutting_down"
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    finishes = [c["finish_reason"] for chunk in chunks for c in chunk.get("choices", []) if c.get("finish_reason")]
    assert finishes == ["length"] * 8 and not any("error" in chunk for chunk in chunks)
    status, body = seen["whole"]  # the non-streamed request finished too
    assert status == 200 and [c["finish_reason"] for c in body["choices"]] == ["length"] * 8
    assert code == 0


@pytest.mark.slow  # a second `keel serve` process (the drain within the timeout stays in the quick tier)
def test_sigterm_past_the_shutdown_timeout_ends_the_stream_with_an_error(tool_model):
    # the tiny model writes 8 x 100 tokens in about 0.3 s, sooner than the stream's first chunk can come: the
    # non-streamed request takes 8 x 1,000 tokens (the tiny checkpoint with a 1,024-token context), still running
    # at the signal
    events, seen, code = run_drain(tool_model, shutdown_timeout=0, whole_tokens=1000)
    assert seen["health"] in (503, None)  # 503, or already gone (a 0 s drain ends at once)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["error"]["code"] == "shutting_down" and "--shutdown-timeout" in last["error"]["message"]
    finishes = [c.get("finish_reason") for e in events[:-2] for c in json.loads(e).get("choices", [])]
    assert finishes.count("length") < 8  # it was cut, not finished
    status, body = seen["whole"]  # the non-streamed request: a 503 naming the shutdown
    assert status == 503 and body["error"]["code"] == "shutting_down", body
    assert code == 0
