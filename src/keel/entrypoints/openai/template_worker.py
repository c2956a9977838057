"""The chat-template job of `keel serve`'s template workers (`keel.sandbox` processes).

A chat template is a program: a request's own template (`--trust-request-chat-template`), or a model's,
may loop for hours or build a gigabyte string. The server renders each one in a sandbox worker it kills
past the time limit, under an address-space limit, and this job bounds the output (at most
`max_output` characters, checked as the template streams).

It imports jinja2 and nothing of keel (importing keel loads torch). The sandbox is the one of
`keel.hf.tokenizer_files.compile_template`: jinja2's ImmutableSandboxedEnvironment (ranges capped at
100,000 items, no attribute access to internals) with the helpers transformers gives templates.
A job is {"source", "context", "max_output"}; the answer {"text"}, or an error the request gets.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from datetime import datetime
from typing import Any


def environment() -> Any:
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class Renderer:
    def __init__(self) -> None:
        self.env = environment()
        self.cache: OrderedDict[str, Any] = OrderedDict()  # source -> compiled template (8 most recent)

    def template(self, source: str) -> Any:
        t = self.cache.get(source)
        if t is None:
            t = self.env.from_string(source)
            self.cache[source] = t
            while len(self.cache) > 8:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(source)
        return t

    def render(self, job: dict[str, Any]) -> dict[str, Any]:
        limit = int(job["max_output"])
        try:
            parts, size = [], 0
            for piece in self.template(job["source"]).generate(**job["context"]):
                size += len(piece)
                if size > limit:
                    return {"error": f"the chat template's output passed this server's limit of {limit} characters"}
                parts.append(piece)
            return {"text": "".join(parts)}
        except MemoryError:
            return {"error": "the chat template needed more memory than this server allows a template"}
        except RecursionError:
            return {"error": "the chat template recursed too deeply"}
        except Exception as exc:  # the template's own error (raise_exception, undefined, a type error, ...)
            return {"error": f"{type(exc).__name__}: {exc}"}


class Handler:
    """The sandbox entry point: one Renderer per worker process; a template's failure raises its message."""

    def __init__(self, init: dict[str, Any]) -> None:
        self.renderer = Renderer()

    def __call__(self, job: dict[str, Any]) -> dict[str, Any]:
        answer = self.renderer.render(job)
        if "error" in answer:
            raise ValueError(answer["error"])
        return answer
