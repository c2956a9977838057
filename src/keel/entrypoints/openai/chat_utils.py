"""Render a chat request with a jinja chat template: tools, tool results, documents, template kwargs.

`keel.hf.tokenizer.Tokenizer.apply_chat_template` renders plain messages; a server also passes the
request's `tools` (and vLLM's `documents`, `chat_template_kwargs`, a per-request `chat_template` when
the operator allows it), assistant `tool_calls` with their arguments as objects (what HF templates index
into), and supports `continue_final_message` (the reply continues the last message instead of starting
a new one).

A template is a program, so `keel serve` never runs one on its event loop: `TemplateRenderer` renders
in sandbox worker processes (`template_worker.py`, jinja2's sandbox) with a time limit (the worker is
killed and replaced past it), a memory limit and an output-size limit; each failure is the request's 400.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keel.sandbox import Busy, LimitExceeded, WorkerError, WorkerLimits, WorkerPool

_RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"})


MAX_JSON_DEPTH = 64  # objects / arrays nested in a tool call's arguments


class ChatInputError(ValueError):
    """A message field the server refuses before rendering; `field` is its path (messages.0.tool_calls...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def json_depth(value: Any) -> int:
    """How deep arrays / objects nest in JSON text (brackets outside strings) or in a parsed value, without
    recursion (the value may nest 100,000 deep)."""
    if isinstance(value, str):
        depth = top = 0
        in_string = escaped = False
        for ch in value:
            if in_string:
                escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
            elif ch == '"':
                in_string = True
            elif ch in "[{":
                depth += 1
                top = max(top, depth)
            elif ch in "]}":
                depth -= 1
        return top
    top, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            top = max(top, depth + 1)
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return top


def _arguments(value: Any, where: str) -> Any:
    """A tool call's arguments as templates read them: parsed to an object when they are JSON text."""
    depth = json_depth(value)
    if depth > MAX_JSON_DEPTH:
        raise ChatInputError(where, f"{where} nests {depth} levels of arrays / objects; at most {MAX_JSON_DEPTH}")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value  # a template that prints it gets the string
    return value


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as HF templates read them: `developer` -> `system`, tool call arguments parsed to objects
    (ChatInputError for arguments nested past MAX_JSON_DEPTH)."""
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        if m.get("role") == "developer":
            m["role"] = "system"
        calls = m.get("tool_calls")
        if calls:
            fixed = []
            for k, c in enumerate(calls):
                c = dict(c)
                fn = dict(c.get("function") or {})
                if "arguments" in fn:
                    fn["arguments"] = _arguments(fn["arguments"], f"messages.{i}.tool_calls.{k}.function.arguments")
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


_WORKER_JOB = Path(__file__).with_name("template_worker.py")


class TemplateRenderer:
    """Chat templates rendered in `workers` sandbox processes (`keel.sandbox`), at most `timeout_s` each,
    `memory_mib` MiB above a worker's baseline, `max_output_chars` characters of output. A request waits for
    a free worker at most `timeout_s` too (else a 503-worthy `TimeoutError`); the event loop never runs a
    template, and no thread of the default executor waits for one."""

    def __init__(
        self, *, workers: int = 2, timeout_s: float = 5.0, memory_mib: int = 512, max_output_chars: int = 1 << 20
    ) -> None:
        if workers < 1 or timeout_s <= 0 or memory_mib < 16 or max_output_chars < 1:
            raise ValueError(
                f"TemplateRenderer: workers >= 1, timeout_s > 0, memory_mib >= 16 and max_output_chars >= 1 "
                f"expected, got {workers}, {timeout_s}, {memory_mib}, {max_output_chars}"
            )
        self.timeout_s, self.max_output_chars = timeout_s, max_output_chars
        limits = WorkerLimits(memory_mib=memory_mib, cpu_s=timeout_s, stack_mib=16)
        self.pool = WorkerPool("template", _WORKER_JOB, workers=workers, limits=limits, max_pending=256)

    @property
    def num_killed(self) -> int:
        """Workers killed past a limit."""
        return self.pool.num_killed

    def _job(self, job: ChatJob) -> tuple[dict[str, Any], dict[str, float]]:
        now = time.monotonic()
        payload = {"source": job.source, "context": job.context, "max_output": self.max_output_chars}
        return payload, {
            "run_s": self.timeout_s,
            "start_by": now + self.timeout_s,
            "deadline": now + 2 * self.timeout_s,
        }

    def _error(self, exc: WorkerError) -> Exception:
        if isinstance(exc, Busy):
            return TimeoutError(f"every chat template worker stayed busy for {self.timeout_s:g} s")
        if isinstance(exc, LimitExceeded) and exc.limit == "time":
            return TemplateError(f"the chat template did not finish within this server's limit of {self.timeout_s:g} s")
        if isinstance(exc, LimitExceeded):
            return TemplateError(f"the chat template {exc}")
        return TemplateError(str(exc))

    def render_sync(self, job: ChatJob) -> str:
        payload, when = self._job(job)
        try:
            answer = self.pool.call(payload, **when)
        except WorkerError as exc:
            raise self._error(exc) from exc
        return finish_text(job, str(answer["text"]))

    async def render(self, job: ChatJob) -> str:
        """The rendered prompt text; TemplateError (400) or TimeoutError (every worker busy)."""
        payload, when = self._job(job)
        try:
            answer = await self.pool.run(payload, **when)
        except WorkerError as exc:
            raise self._error(exc) from exc
        return finish_text(job, str(answer["text"]))

    def close(self) -> None:
        self.pool.close()
