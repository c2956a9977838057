"""The llguidance adapter: specs -> grammars -> cached matcher templates -> per-request matchers, and the
batch bitmask. Nothing here knows the engine: a spec is a (kind, value) pair, as
`SamplingParams.structured_outputs` gives it.

A spec is client input for native code whose cost it chooses (a few thousand chained Lark rules
overflow a thread's stack; an `allOf` of string patterns builds an automaton exponential in their
count). So a spec passes the cheap static limits of `GrammarLimits` first, then llguidance compiles it
in a sandbox worker process (`compile_job`) under an address-space, CPU-time and wall-clock limit, killed
at the request's deadline or when the request gives up; only a grammar that compiled there is built
again here, on big-stack threads, with llguidance's parser limits bounding every later token mask.
`GrammarCompiler.prepare` lets a server do all this before the engine sees the request (the engine
thread then only copies the prepared template).
"""

from __future__ import annotations

import concurrent.futures
import json
import queue
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from keel.errors import RequestValidationError
from keel.sandbox import Abandoned, Busy, JobFailed, LimitExceeded, WorkerLimits, WorkerPool
from keel.structured import compile_job


def _invalid(field: str, message: str) -> ValueError:
    """A RequestValidationError naming the request field."""
    return RequestValidationError(field, message)


class GrammarBusy(RuntimeError):
    """Every grammar worker stayed busy past the request's deadline, or too many compiles wait (a 503)."""


@dataclass(frozen=True, slots=True)
class ParserLimits:
    """llguidance's own limits on a matcher (LLParserLimits): they bound every token mask's work."""

    max_lexer_states: int = 50_000  # the lexer automaton's states (1-2 kB each)
    step_lexer_fuel: int = 200_000  # lexer work per token mask
    step_max_items: int = 50_000  # Earley items per token mask
    initial_lexer_fuel: int = 1_000_000  # building the lexer's regexes
    max_grammar_size: int = 500_000  # symbols in the grammar's productions


@dataclass(frozen=True, slots=True)
class GrammarLimits:
    """What a spec may hold before it is compiled, and what its compile may use (each one a 400 naming the
    field and the limit)."""

    max_bytes: int = 64 * 1024  # grammar, regex, schema (as JSON) or choices, in UTF-8 bytes
    max_depth: int = 64  # brackets nested in a grammar or regex; objects / arrays nested in a schema
    max_rules: int = 1024  # rule definitions of a Lark / GBNF grammar
    max_schema_nodes: int = 4096  # objects, arrays and values of a JSON schema
    max_choices: int = 1024
    max_intersected_patterns: int = 12  # `pattern`s under one `allOf` (their intersection grows exponentially)
    compile_timeout_s: float = 10.0  # a request waits this long for its grammar; its compile is killed then
    workers: int = 2  # compile worker processes
    memory_mib: int = 512  # address space of a compile worker above its baseline
    parser: ParserLimits = ParserLimits()

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_depth", "max_rules", "max_schema_nodes", "max_choices", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"GrammarLimits: {name} must be >= 1, got {getattr(self, name)}")
        if self.max_intersected_patterns < 1 or not self.compile_timeout_s > 0 or self.memory_mib < 64:
            raise ValueError(
                "GrammarLimits: max_intersected_patterns >= 1, compile_timeout_s > 0 and memory_mib >= 64 expected, "
                f"got {self.max_intersected_patterns}, {self.compile_timeout_s}, {self.memory_mib}"
            )


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


def _intersected_patterns(value: Any) -> int:
    """The most `pattern`s one `allOf` of a schema intersects (its own and those under its members)."""
    worst = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            members = item.get("allOf")
            if isinstance(members, list):
                worst = max(worst, ("pattern" in item) + _count_key(members, "pattern"))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return worst


def _count_key(value: Any, key: str) -> int:
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            count += key in item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def _check_schema(value: Any, limits: GrammarLimits, refuse: Callable[[str], None]) -> None:
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
    patterns = _intersected_patterns(value)
    if patterns > limits.max_intersected_patterns:
        refuse(
            f"an allOf intersects {patterns} string patterns; this server's limit is "
            f"{limits.max_intersected_patterns} (each one can multiply the compiled automaton's size)"
        )


def _check_text(kind: str, value: Any, limits: GrammarLimits, refuse: Callable[[str], None]) -> None:
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


def check_spec(kind: str, value: Any, limits: GrammarLimits) -> None:
    """Refuse a spec past `limits` before any native parser sees it (RequestValidationError naming the field)."""
    where = f"structured_outputs.{kind}"

    def refuse(what: str) -> None:
        raise _invalid(where, f"{where}: {what}")

    if kind == "json":
        _check_schema(value, limits, refuse)
    elif kind in ("regex", "grammar"):
        _check_text(kind, value, limits, refuse)
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


class Compile:
    """A spec being prepared: `future` resolves to its key once its template is pinned (release it with
    `GrammarCompiler.release`); `cancel()` gives up on it, killing its compile if one runs."""

    def __init__(self, compiler: GrammarCompiler, key: tuple[str, str]) -> None:
        self.compiler, self.key = compiler, key
        self.future: concurrent.futures.Future[tuple[str, str]] = concurrent.futures.Future()
        self.job: concurrent.futures.Future[Any] | None = None  # the sandbox job, while it runs
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        if self.job is not None and self.compiler._workers is not None:
            self.compiler._workers.cancel(self.job)
        if self.future.done() and not self.future.cancelled() and self.future.exception() is None:
            self.compiler.release(self.key)  # it was pinned for a request that is gone
        else:
            self.future.cancel()


class GrammarCompiler:
    """One per engine: the llguidance tokenizer (built once from tokenizer.json, about a second), an LRU
    cache of compiled matcher templates keyed by the spec, templates a server prepared for requests it is
    adding (`prepare` / `release`), the sandbox compile workers, the big-stack threads that build a
    compiled grammar's template, and the executor that fills batch bitmasks."""

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
        self._tokenizer_json, self._eos = tokenizer_json, list(eos_token_ids)
        self._tok = llguidance.LLTokenizer(
            tokenizer_json.read_text(encoding="utf-8"), n_vocab=vocab_size, eos_token=self._eos or None
        )
        self._executor = llguidance.LLExecutor()
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._cache_size = cache_size
        self._pinned: dict[tuple[str, str], tuple[Any, int]] = {}  # prepared for requests being added
        self._lock = threading.Lock()  # add_request may come from another thread than step (keel serve)
        self._workers: WorkerPool | None = None  # started on the first compile, with the limits then
        self.builders = CompileWorkers()
        self.num_compiled = 0  # templates built (cache misses), for tests and metrics

    def configure(self, limits: GrammarLimits) -> None:
        """Use `limits` from now on (a server's); running compile workers are replaced."""
        with self._lock:
            self.limits, workers, self._workers = limits, self._workers, None
        if workers is not None:
            workers.close()

    @property
    def workers(self) -> WorkerPool:
        """The sandbox processes that compile specs."""
        with self._lock:
            if self._workers is None:
                lim = self.limits
                init = {
                    "tokenizer_json": str(self._tokenizer_json),
                    "vocab_size": self.vocab_size,
                    "eos": self._eos,
                    "parser_limits": asdict(lim.parser),
                }
                self._workers = WorkerPool(
                    "grammar",
                    Path(compile_job.__file__),
                    init,
                    workers=lim.workers,
                    limits=WorkerLimits(memory_mib=lim.memory_mib, cpu_s=lim.compile_timeout_s),
                )
            return self._workers

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

    def _pin(self, key: tuple[str, str], template: Any) -> None:
        with self._lock:
            held = self._pinned.get(key)
            self._pinned[key] = (template, (held[1] if held else 0) + 1)

    def prepare(self, kind: str, value: Any, deadline: float | None = None) -> Compile:
        """Compile a spec in a sandbox worker (killed at `deadline`, monotonic; default now + the compile
        timeout), build its template here and pin it until `release(key)`: the engine thread's `matcher`
        then finds it without compiling. Raises RequestValidationError for a spec past the static limits
        and GrammarBusy when too many compiles wait; the future raises RequestValidationError (a spec
        llguidance refuses, or one past a worker's limit) or GrammarBusy."""
        key = self.key(kind, value)
        handle = Compile(self, key)
        template = self._lookup(key)
        if template is not None:
            self._pin(key, template)
            handle.future.set_result(key)
            return handle
        check_spec(kind, value, self.limits)
        timeout = self.limits.compile_timeout_s
        try:
            handle.job = self.workers.submit(
                {"kind": kind, "value": value}, run_s=timeout, deadline=deadline or time.monotonic() + timeout
            )
        except Busy as exc:
            raise GrammarBusy(str(exc)) from exc
        handle.job.add_done_callback(lambda job: self._compiled(handle, kind, job))
        return handle

    def _compiled(self, handle: Compile, kind: str, job: concurrent.futures.Future[Any]) -> None:
        """The sandbox's answer: an error for the request, or the grammar to build here (off this thread)."""
        if handle.cancelled or job.cancelled():
            handle.future.cancel()
            return
        exc = job.exception()
        if exc is not None:
            handle.future.set_exception(self._error(kind, exc))
            return
        grammar = job.result()["grammar"]

        def build() -> None:
            if handle.cancelled:
                handle.future.cancel()
                return
            try:
                self._pin(handle.key, self._build(handle.key, kind, grammar))
            except BaseException as build_exc:  # noqa: BLE001 - handed to the request
                handle.future.set_exception(build_exc)
                return
            handle.future.set_result(handle.key)

        self.builders.submit(build)

    def _error(self, kind: str, exc: BaseException) -> BaseException:
        where = f"structured_outputs.{kind}"
        if isinstance(exc, JobFailed):
            text = str(exc)
            return _invalid(where, text if text.startswith("structured_outputs") else f"{where}: {text}")
        if isinstance(exc, LimitExceeded):
            if exc.limit == "time":
                limit = self.limits.compile_timeout_s
                return _invalid(
                    where, f"{where}: the grammar did not compile within this server's limit of {limit:g} s"
                )
            return _invalid(where, f"{where}: compiling the grammar {exc}")
        if isinstance(exc, Busy):
            return GrammarBusy(str(exc))
        if isinstance(exc, Abandoned):
            return exc
        return exc

    def _build(self, key: tuple[str, str], kind: str, grammar: str) -> Any:
        """The template of a grammar the sandbox compiled, cached (on a big-stack thread: it recurses too)."""
        import llguidance

        template = llguidance.LLMatcher(
            self._tok, grammar, log_level=0, limits=compile_job.parser_limits(asdict(self.limits.parser))
        )
        if template.is_error():
            where = f"structured_outputs.{kind}"
            raise _invalid(where, f"{where}: {template.get_error()}")
        with self._lock:
            self.num_compiled += 1
            self._cache[key] = template
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return template

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
        in a sandbox worker while the caller waits)."""
        key = self.key(kind, value)
        template = self._lookup(key)
        if template is None:
            handle = self.prepare(kind, value)
            try:
                handle.future.result()
            except BaseException:
                handle.cancel()
                raise
            template = self._lookup(key)
            self.release(key)
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

    def close(self) -> None:
        """Stop the compile worker processes (a later compile starts new ones)."""
        with self._lock:
            workers, self._workers = self._workers, None
        if workers is not None:
            workers.close()
