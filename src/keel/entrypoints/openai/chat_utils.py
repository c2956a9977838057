"""Render a chat request with a jinja chat template: tools, tool results, documents, template kwargs.

`keel.hf.tokenizer.Tokenizer.apply_chat_template` renders plain messages; a server also passes the
request's `tools` (and vLLM's `documents`, `chat_template_kwargs`, a per-request `chat_template` when
the operator allows it), assistant `tool_calls` with their arguments as objects (what HF templates index
into), and supports `continue_final_message` (the reply continues the last message instead of starting
a new one).

A template is a program, so `keel serve` never runs one on its event loop: `TemplateRenderer` renders
in worker processes (`template_worker.py`, jinja2's sandbox) with a time limit (the worker is killed
and replaced past it), a memory limit and an output-size limit; each failure is the request's 400.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"})


def renders_tools(template: str | None) -> bool:
    """Whether a chat template reads the `tools` variable (so tool_choice auto has something to act on)."""
    return template is not None and "tools" in template


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as HF templates read them: `developer` -> `system`, tool call arguments parsed to objects."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "developer":
            m["role"] = "system"
        calls = m.get("tool_calls")
        if calls:
            fixed = []
            for c in calls:
                c = dict(c)
                fn = dict(c.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        pass  # a template that prints it gets the string
                c["function"] = fn
                fixed.append(c)
            m["tool_calls"] = fixed
        out.append(m)
    return out


@dataclass(slots=True)
class ChatJob:
    """A validated chat render: the template's source and the variables it sees."""

    source: str
    context: dict[str, Any]
    final: str | None  # continue_final_message: the final message's text, where the output is cut


def chat_job(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> ChatJob:
    """Check a chat request's template fields (ValueError naming what is wrong) and build its render job."""
    source = chat_template or tokenizer.chat_template
    if source is None:
        raise ValueError("this model has no chat template; use /v1/completions")
    kwargs = dict(chat_template_kwargs or {})
    clash = sorted(_RESERVED & kwargs.keys())
    if clash:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(clash)} (the request's own fields do)")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
    msgs = template_messages(messages)
    if continue_final_message and (not msgs or msgs[-1].get("role") != "assistant"):
        raise ValueError("continue_final_message needs the last message to be the assistant's")
    final = None
    if continue_final_message:
        final = msgs[-1].get("content") or ""
        if isinstance(final, list):
            final = "".join(p.get("text", "") for p in final)
    context = {
        **kwargs,
        "messages": msgs,
        "tools": tools,
        "documents": documents,
        "add_generation_prompt": add_generation_prompt,
        "bos_token": tokenizer.bos_token or "",
        "eos_token": tokenizer.eos_token or "",
    }
    return ChatJob(source, context, final)


def finish_text(job: ChatJob, text: str) -> str:
    """continue_final_message: cut what the template adds after the final message (its end-of-turn)."""
    if job.final:
        at = text.rfind(job.final)
        if at >= 0:
            text = text[: at + len(job.final)]
    return text


class TemplateError(ValueError):
    """A chat template failed, ran past its time, memory or output limit (the request's 400)."""


_WORKER_SCRIPT = Path(__file__).with_name("template_worker.py")


class _Worker:
    """One template worker process; `call` is blocking (run it off the event loop)."""

    def __init__(self, memory_mib: int) -> None:
        self.memory_mib = memory_mib
        self.proc: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        # -I: no PYTHONPATH, no user site, no script folder on sys.path (this folder's `tokenize` package
        # would shadow the standard library's)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(_WORKER_SCRIPT), str(self.memory_mib)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        return self.proc

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(5)

    def call(self, job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        proc = self.proc if self.proc is not None and self.proc.poll() is None else self._start()
        assert proc.stdin is not None and proc.stdout is not None
        payload = json.dumps(job).encode("utf-8")
        deadline = time.monotonic() + timeout_s
        try:
            proc.stdin.write(struct.pack(">I", len(payload)) + payload)
            proc.stdin.flush()
            fd = proc.stdout.fileno()
            head = self._read(fd, 4, deadline)
            (n,) = struct.unpack(">I", head)
            return json.loads(self._read(fd, n, deadline))
        except TimeoutError:
            self.kill()  # the only way to stop a template mid-loop; the next call starts a fresh worker
            raise TemplateError(
                f"the chat template did not finish within this server's limit of {timeout_s:g} s"
            ) from None
        except (OSError, EOFError, ValueError, struct.error) as exc:
            self.kill()
            raise TemplateError(
                f"the chat template worker failed ({type(exc).__name__}); the request was not rendered"
            ) from exc

    @staticmethod
    def _read(fd: int, n: int, deadline: float) -> bytes:
        out = bytearray()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, n - len(out))
            if not chunk:
                raise EOFError("the template worker exited")
            out += chunk
        return bytes(out)


class TemplateRenderer:
    """Chat templates rendered in `workers` killable processes, at most `timeout_s` each, `memory_mib` MiB
    above a worker's baseline, `max_output_chars` characters of output. A request waits for a free worker
    (at most `timeout_s` too, else a 503-worthy `TimeoutError`); the event loop never runs a template."""

    def __init__(
        self, *, workers: int = 2, timeout_s: float = 5.0, memory_mib: int = 512, max_output_chars: int = 1 << 20
    ) -> None:
        if workers < 1 or timeout_s <= 0 or memory_mib < 16 or max_output_chars < 1:
            raise ValueError(
                f"TemplateRenderer: workers >= 1, timeout_s > 0, memory_mib >= 16 and max_output_chars >= 1 "
                f"expected, got {workers}, {timeout_s}, {memory_mib}, {max_output_chars}"
            )
        self.timeout_s, self.max_output_chars = timeout_s, max_output_chars
        self._workers = [_Worker(memory_mib) for _ in range(workers)]
        self._idle: list[_Worker] = list(self._workers)
        self._lock = threading.Lock()
        self._free = threading.Semaphore(workers)
        self.num_killed = 0  # workers killed past the time limit

    def _take(self) -> _Worker:
        if not self._free.acquire(timeout=self.timeout_s):
            raise TimeoutError(f"every chat template worker stayed busy for {self.timeout_s:g} s")
        with self._lock:
            return self._idle.pop()

    def _give(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)
        self._free.release()

    def render_sync(self, job: ChatJob) -> str:
        worker = self._take()
        try:
            alive = worker.proc is not None
            try:
                answer = worker.call(
                    {"source": job.source, "context": job.context, "max_output": self.max_output_chars}, self.timeout_s
                )
            except TemplateError:
                if alive and worker.proc is None:
                    self.num_killed += 1
                raise
        finally:
            self._give(worker)
        if "error" in answer:
            raise TemplateError(str(answer["error"]))
        return finish_text(job, str(answer["text"]))

    async def render(self, job: ChatJob) -> str:
        """The rendered prompt text; TemplateError (400) or TimeoutError (every worker busy)."""
        return await asyncio.to_thread(self.render_sync, job)

    def close(self) -> None:
        for w in self._workers:
            if w.proc is not None and w.proc.stdin is not None:
                try:
                    w.proc.stdin.close()  # the worker exits on end of input
                except OSError:
                    pass
            w.kill()
