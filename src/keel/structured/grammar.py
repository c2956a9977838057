"""The llguidance adapter: specs -> grammars -> cached matcher templates -> per-request matchers, and the
batch bitmask. Nothing here knows the engine: a spec is a (kind, value) pair, as
`SamplingParams.structured_outputs` gives it.

llguidance's parsers are native code that recurses with the input: a Lark grammar chaining a few
thousand rules overflowed a default thread stack (SIGSEGV, the whole server gone), and a 10,000-property
schema took 11 s to compile. So every spec is first checked against `GrammarLimits` (size, nesting
depth, rules, schema nodes), and every compile runs on `CompileWorkers`, threads with a 256 MiB stack;
`GrammarCompiler.prepare` lets a server compile a request's grammar there before the engine sees it
(the engine thread then only copies the prepared template), with a time limit the request waits for.
"""

from __future__ import annotations

import concurrent.futures
import json
import queue
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from keel.errors import RequestValidationError


def _invalid(field: str, message: str) -> ValueError:
    """A RequestValidationError naming the request field."""
    return RequestValidationError(field, message)


# compact JSON (no free whitespace between tokens): a small model cannot wander off into blank lines, and
# the output is what json.dumps(separators=(",", ":")) writes
_JSON_OPTIONS = {"whitespace_flexible": False}


@dataclass(frozen=True, slots=True)
class GrammarLimits:
    """What a spec may hold before it is compiled (each one a 400 naming the field and the limit)."""

    max_bytes: int = 64 * 1024  # grammar, regex, schema (as JSON) or choices, in UTF-8 bytes
    max_depth: int = 64  # brackets nested in a grammar or regex; objects / arrays nested in a schema
    max_rules: int = 1024  # rule definitions of a Lark / GBNF grammar
    max_schema_nodes: int = 4096  # objects, arrays and values of a JSON schema
    max_choices: int = 1024
    compile_timeout_s: float = 10.0  # a server's request waits this long for its grammar, then gets a 400


_RULE = re.compile(r"^\s*[?!]?[A-Za-z_][\w.]*(\{[^}\n]*\})?(\.-?\d+)?\s*(:|::=)", re.MULTILINE)


def _bracket_depth(text: str) -> int:
    """The deepest nesting of (), [] and {} outside quoted strings (a regex's own groups count)."""
    depth = top = 0
    quote = ""
    escaped = False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
            top = max(top, depth)
        elif ch in ")]}":
            depth = max(0, depth - 1)
    return top


def _json_shape(value: Any, max_nodes: int) -> tuple[int, int]:
    """(nodes, depth) of a JSON value, counting stops past `max_nodes` (no recursion: it may be deep)."""
    nodes = top = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack and nodes <= max_nodes:
        item, depth = stack.pop()
        nodes += 1
        top = max(top, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return nodes, top


def check_spec(kind: str, value: Any, limits: GrammarLimits) -> None:
    """Refuse a spec past `limits` before any native parser sees it (RequestValidationError naming the field)."""
    where = f"structured_outputs.{kind}"

    def refuse(what: str) -> None:
        raise _invalid(where, f"{where}: {what}")

    if kind == "json":
        if isinstance(value, str):
            if len(value.encode("utf-8", "surrogatepass")) > limits.max_bytes:
                refuse(f"the schema is larger than this server's limit of {limits.max_bytes} bytes")
            try:
                value = json.loads(value)
            except (ValueError, RecursionError) as exc:
                refuse(f"the schema is not valid JSON: {exc}")
        nodes, depth = _json_shape(value, limits.max_schema_nodes)
        if nodes > limits.max_schema_nodes:
            refuse(f"the schema has more than this server's limit of {limits.max_schema_nodes} nodes")
        if depth > limits.max_depth:
            refuse(f"the schema nests {depth} levels; this server's limit is {limits.max_depth}")
        size = len(json.dumps(value))
        if size > limits.max_bytes:
            refuse(f"the schema is larger than this server's limit of {limits.max_bytes} bytes ({size})")
    elif kind in ("regex", "grammar"):
        if not isinstance(value, str):
            refuse(f"expected a string, got {type(value).__name__}")
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > limits.max_bytes:
            refuse(f"the {kind} is {size} bytes; this server's limit is {limits.max_bytes}")
        depth = _bracket_depth(value)
        if depth > limits.max_depth:
            refuse(f"the {kind} nests brackets {depth} deep; this server's limit is {limits.max_depth}")
        if kind == "grammar":
            rules = len(_RULE.findall(value))
            if rules > limits.max_rules:
                refuse(f"the grammar defines {rules} rules; this server's limit is {limits.max_rules}")
    elif kind == "choice":
        items = list(value or [])
        if len(items) > limits.max_choices:
            refuse(f"{len(items)} choices; this server's limit is {limits.max_choices}")
        size = sum(len(str(c).encode("utf-8", "surrogatepass")) for c in items)
        if size > limits.max_bytes:
            refuse(f"the choices hold {size} bytes; this server's limit is {limits.max_bytes}")


class CompileWorkers:
    """Threads with a large stack (native parsers recurse with their input) that run compile jobs in order.

    `threading.stack_size` applies to threads created after it is set, so the threads are made once
    here, under a lock, and the previous size is restored."""

    _stack_lock = threading.Lock()

    def __init__(self, threads: int = 2, stack_mib: int = 256, max_pending: int = 64) -> None:
        self.max_pending = max_pending
        self._jobs: queue.Queue[tuple[concurrent.futures.Future[Any], Callable[[], Any]] | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        with CompileWorkers._stack_lock:
            old = threading.stack_size()
            threading.stack_size(stack_mib << 20)
            try:
                for i in range(threads):
                    t = threading.Thread(target=self._loop, name=f"keel-grammar-{i}", daemon=True)
                    t.start()
                    self._threads.append(t)
            finally:
                threading.stack_size(old)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, fn = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller
                fut.set_exception(exc)

    @property
    def pending(self) -> int:
        return self._jobs.qsize()

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Run `fn` on a worker; RuntimeError when more than `max_pending` jobs wait already."""
        if self._jobs.qsize() >= self.max_pending:
            raise RuntimeError(f"{self._jobs.qsize()} grammars are waiting to compile already; retry later")
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((fut, fn))
        return fut

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)


def grammar_text(kind: str, value: Any) -> str:
    """The llguidance grammar of one spec; ValueError("structured_outputs.<kind>: ...") when it is bad."""
    from llguidance import LLMatcher, grammar_from

    try:
        if kind == "json":
            schema = json.loads(value) if isinstance(value, str) else value
            if not isinstance(schema, dict | bool):
                raise ValueError(f"a JSON schema is an object, got {type(schema).__name__}")
            return str(LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_JSON_OPTIONS))  # type: ignore[arg-type]
        if kind == "json_object":
            return str(LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=_JSON_OPTIONS))  # type: ignore[arg-type]
        if kind == "regex":
            return str(LLMatcher.grammar_from_regex(value))
        if kind == "choice":
            return str(grammar_from("choice", json.dumps(list(value))))
        if kind == "grammar":
            return str(grammar_from("grammar", value))  # Lark, or GBNF (converted)
    except (ValueError, TypeError, RecursionError) as exc:
        raise _invalid(f"structured_outputs.{kind}", f"structured_outputs.{kind}: {exc}") from exc
    raise _invalid(
        "structured_outputs",
        f"structured_outputs: unknown kind {kind!r}; expected json, json_object, regex, choice, grammar",
    )


class GrammarCompiler:
    """One per engine: the llguidance tokenizer (built once from tokenizer.json, about a second), an LRU
    cache of compiled matcher templates keyed by the spec, templates a server prepared for requests it is
    adding (`prepare` / `release`), the big-stack compile workers, and the executor that fills batch
    bitmasks."""

    def __init__(
        self,
        tokenizer_json: Path,
        vocab_size: int,
        eos_token_ids: list[int],
        cache_size: int = 64,
        limits: GrammarLimits | None = None,
    ) -> None:
        import llguidance

        self.vocab_size = vocab_size
        self.limits = limits or GrammarLimits()
        self._tok = llguidance.LLTokenizer(
            tokenizer_json.read_text(encoding="utf-8"), n_vocab=vocab_size, eos_token=list(eos_token_ids) or None
        )
        self._executor = llguidance.LLExecutor()
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._cache_size = cache_size
        self._pinned: dict[tuple[str, str], tuple[Any, int]] = {}  # prepared for requests being added
        self._lock = threading.Lock()  # add_request may come from another thread than step (keel serve)
        self.workers = CompileWorkers()
        self.num_compiled = 0  # templates built (cache misses), for tests and metrics

    @staticmethod
    def key(kind: str, value: Any) -> tuple[str, str]:
        return kind, value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    def _lookup(self, key: tuple[str, str]) -> Any:
        with self._lock:
            pinned = self._pinned.get(key)
            if pinned is not None:
                return pinned[0]
            template = self._cache.get(key)
            if template is not None:
                self._cache.move_to_end(key)
            return template

    def _compile(self, kind: str, value: Any) -> Any:
        """Check, compile and cache a spec's template (on a compile worker: the native parsers recurse)."""
        import llguidance

        key = self.key(kind, value)
        template = self._lookup(key)
        if template is not None:
            return template
        check_spec(kind, value, self.limits)
        where = f"structured_outputs.{kind}"
        grammar = grammar_text(kind, value)
        err = llguidance.LLMatcher.validate_grammar(grammar, self._tok)
        if err and not err.startswith("WARNING"):
            raise _invalid(where, f"{where}: {err}")
        template = llguidance.LLMatcher(self._tok, grammar, log_level=0)
        if template.is_error():
            raise _invalid(where, f"{where}: {template.get_error()}")
        with self._lock:
            self.num_compiled += 1
            self._cache[key] = template
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return template

    def prepare(self, kind: str, value: Any) -> concurrent.futures.Future[tuple[str, str]]:
        """Compile a spec on a worker and pin its template until `release(key)` (the future's result): the
        engine thread's `matcher` then finds it without compiling. Raises RuntimeError when too many
        compiles wait, RequestValidationError (in the future) for a spec past the limits or malformed."""
        key = self.key(kind, value)

        def job() -> tuple[str, str]:
            template = self._compile(kind, value)
            with self._lock:
                held = self._pinned.get(key)
                self._pinned[key] = (template, (held[1] if held else 0) + 1)
            return key

        return self.workers.submit(job)

    def release(self, key: tuple[str, str]) -> None:
        with self._lock:
            held = self._pinned.get(key)
            if held is None:
                return
            if held[1] <= 1:
                del self._pinned[key]
            else:
                self._pinned[key] = (held[0], held[1] - 1)

    def matcher(self, kind: str, value: Any) -> Any:
        """A fresh matcher for one request: a copy of the spec's template (prepared, cached, or compiled now
        on a compile worker while the caller waits)."""
        template = self._lookup(self.key(kind, value))
        if template is None:
            template = self.workers.submit(lambda: self._compile(kind, value)).result()
        return template.deep_copy()

    def bitmask(self, matchers: list[Any]) -> torch.Tensor:
        """The allowed-token bitmask [len(matchers), ceil(V/32)] int32 of each matcher's next token."""
        words = (self.vocab_size + 31) // 32
        mask = torch.full((len(matchers), words), -1, dtype=torch.int32)
        # what llguidance.torch.fill_next_token_bitmask_par does, without importing that module (it
        # decorates a kernel with torch.compile at import time, which keel does not use)
        self._executor.unsafe_compute_mask_ptr(
            [(m, i) for i, m in enumerate(matchers)], mask.data_ptr(), words * 4, len(matchers)
        )
        return mask
