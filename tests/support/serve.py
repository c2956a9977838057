"""Helpers of the server tests: start `keel serve`'s app over the real engine, read its metrics, steer steps."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keel_dev.checkpoints import build_checkpoint, train_tokenizer

from support.native import keel_native_ops, needs_ops  # noqa: E402,F401

MODEL_NAME = "tiny"
BLOCK_SIZE = 4
KV_BLOCKS = 512  # 16 concurrent requests of a full 128-token context need 16 * 32 blocks


def build_tiny_model(root: Path) -> Path:
    """A random SmolLM2-shaped checkpoint (context 128, vocab 320) with the trained test tokenizer."""
    tok = root / "tokenizer"
    tok.mkdir()
    train_tokenizer(tok)
    build_checkpoint(root / "tiny", "smollm2", tok)
    return root / "tiny"


def make_engine(folder: Path, **kwargs: Any) -> Any:
    """The real engine over the tiny checkpoint: fp32 on CPU, 4-token blocks, a small KV budget."""
    from keel.engine import LLMEngine

    return LLMEngine(
        str(folder),
        dtype="float32",
        device="cpu",
        block_size=BLOCK_SIZE,
        progress=False,
        max_kv_cache_bytes=KV_BLOCKS * kv_bytes_per_block(folder),
        **kwargs,
    )


def kv_bytes_per_block(folder: Path) -> int:
    """K and V of one block in every layer, fp32."""
    import json

    cfg = json.loads((folder / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * BLOCK_SIZE * 4


@dataclass
class Served:
    """A running server: its URL, its AsyncEngine (whose `engine` is the real LLMEngine) and helpers."""

    thread: Any
    engine: Any

    @property
    def base_url(self) -> str:
        return self.thread.base_url

    def stop(self) -> None:
        self.thread.stop()
        self.engine.shutdown()

    def client(self, **kwargs: Any) -> Any:
        import openai

        return openai.OpenAI(
            base_url=self.base_url + "/v1", api_key=kwargs.pop("api_key", "unused"), max_retries=0, **kwargs
        )

    def async_client(self, **kwargs: Any) -> Any:
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url + "/v1", api_key="unused", max_retries=0, **kwargs)

    def metrics(self) -> dict[str, float]:
        """`GET /metrics`, parsed with prometheus_client's own parser: `name` or `name{extra labels}` -> value
        (the `model_name` and `engine` labels every sample carries are dropped)."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        text = urllib.request.urlopen(self.base_url + "/metrics", timeout=10).read().decode()
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = {k: v for k, v in sample.labels.items() if k not in ("model_name", "engine")}
                extra = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                out[f"{sample.name}{{{extra}}}" if extra else sample.name] = sample.value
        return out

    def wait_idle(self, timeout: float = 30.0) -> dict[str, float]:
        """Wait until the engine holds no request and no KV block; return the metrics then."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = m["keel_kv_cache_blocks_used"] == 0 and m["vllm:num_requests_running"] == 0
            if idle and m["vllm:num_requests_waiting"] == 0 and self.engine.num_open == 0:
                return m
            if time.monotonic() > deadline:
                gauges = {
                    k.removeprefix("keel_"): m[k]
                    for k in ("keel_kv_cache_blocks_used", "vllm:num_requests_running", "vllm:num_requests_waiting")
                }
                raise AssertionError(
                    f"server not idle after {timeout} s: {gauges}, open streams {self.engine.num_open}"
                )
            time.sleep(0.02)

    def server_tasks(self) -> int:
        """asyncio tasks alive on the server's loop (besides the one counting them)."""

        async def count() -> int:
            return len(asyncio.all_tasks()) - 1

        return asyncio.run_coroutine_threadsafe(count(), self.thread.loop).result(10)


def start_server(folder: Path, *, engine_kwargs: dict | None = None, **app_kwargs: Any) -> Served:
    from keel.engine.async_engine import AsyncEngine
    from keel.entrypoints.openai.api_server import ServerThread, build_app
    from keel.entrypoints.openai.server_config import ServerConfig

    limits = app_kwargs.pop("limits", None) or ServerConfig(max_tokens=512)
    llm = make_engine(folder, **(engine_kwargs or {}))
    max_num_seqs = (engine_kwargs or {}).get("max_num_seqs", 64)
    engine = AsyncEngine(llm, max_admitted=max_num_seqs + limits.max_waiting)
    app = build_app(engine, model_name=MODEL_NAME, limits=limits, **app_kwargs)
    return Served(ServerThread(app).start(), engine)


class StepControl:
    """Wraps the engine's `step` (test side only): a pause gate and a minimum duration per step.

    A paused engine thread holds its requests mid-flight, so a test can act on them deterministically.
    """

    def __init__(self, llm: Any) -> None:
        self.llm, self.original = llm, llm.step
        self.delay_s = 0.0
        self.peak_running = 0  # the most requests the engine reported running after a step
        self._gate = threading.Event()
        self._gate.set()
        llm.step = self._step

    def _step(self) -> Any:
        self._gate.wait()
        time.sleep(self.delay_s)
        outputs = self.original()
        self.peak_running = max(self.peak_running, self.llm.metrics().num_running)
        return outputs

    def pause(self) -> None:
        self._gate.clear()

    def resume(self) -> None:
        self._gate.set()

    def restore(self) -> None:
        self.resume()
        self.llm.step = self.original
