"""The chat-template worker process of `keel serve` (run as a script, `python -I template_worker.py MEM OUT`).

A chat template is a program: a request's own template (`--trust-request-chat-template`), or a model's,
may loop for hours or build a gigabyte string. The server renders each one here, in a child process it
can kill, never on its event loop: the parent bounds the time (it kills this process past the timeout
and starts another), this process bounds its memory (RLIMIT_AS: MEM MiB above what it uses at start)
and the output (at most OUT characters, checked as the template streams).

It imports jinja2 and nothing of keel (importing keel loads torch). The sandbox is the one of
`keel.hf.tokenizer_files.compile_template`: jinja2's ImmutableSandboxedEnvironment (ranges capped at
100,000 items, no attribute access to internals) with the helpers transformers gives templates.

Protocol on stdin / stdout: frames of a 4-byte big-endian length and a UTF-8 JSON object. A job is
{"source", "context", "max_output"}; the answer {"text"} or {"error"}.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections import OrderedDict
from datetime import datetime
from typing import Any, BinaryIO


def _vm_bytes() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def limit_memory(extra_mib: int) -> None:
    """Cap this process's address space at what it maps now plus `extra_mib` MiB (Linux; elsewhere a no-op)."""
    try:
        import resource
    except ImportError:
        return
    base = _vm_bytes()
    if base:
        cap = base + extra_mib * (1 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


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


def read_frame(stream: BinaryIO) -> bytes | None:
    head = stream.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack(">I", head)
    return stream.read(n)


def write_frame(stream: BinaryIO, payload: bytes) -> None:
    stream.write(struct.pack(">I", len(payload)) + payload)
    stream.flush()


def main(argv: list[str]) -> int:
    memory_mib = int(argv[1]) if len(argv) > 1 else 512
    renderer = Renderer()
    limit_memory(memory_mib)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the pipe
    while True:
        frame = read_frame(stdin)
        if frame is None:  # the server closed the pipe: it is gone or stopping
            return 0
        try:
            answer = renderer.render(json.loads(frame))
        except MemoryError:
            answer = {"error": "the chat template needed more memory than this server allows a template"}
        try:
            payload = json.dumps(answer).encode("utf-8")
        except (UnicodeEncodeError, MemoryError):
            payload = json.dumps({"error": "the chat template's output could not be encoded"}).encode()
        write_frame(stdout, payload)


if __name__ == "__main__":
    os.environ.pop("PYTHONPATH", None)
    sys.exit(main(sys.argv))
