"""`LLMEngine`: requests in (`add_request`, `abort_request`), one step at a time out (`step`).

Each step is schedule -> run -> postprocess: the scheduler picks the sequences, their KV blocks and how
many tokens each computes under the step's token budget, the model runner computes them in one varlen
forward pass (the running decodes, new prompts past their cached prefix, chunks of long prompts) and
samples for the sequences whose chunk reaches their end, and `_postprocess` appends each token, checks the
stops, detokenizes and finishes requests. A request that fails alone (its sampler row, its forward pass
or its postprocessing raises) finishes with finish_reason "error"; `step` goes on with the others.
Requests that arrive while others decode join the batch at the next step (continuous batching).

Not thread-safe: drive it from one thread at a time (`keel serve`'s AsyncEngine owns it in one
thread; `LLM.generate` serializes its callers). A call that enters while another thread is inside the
engine raises instead of corrupting the scheduler and the block tables."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from keel.engine import host_memory
from keel.engine.config import EngineConfig
from keel.engine.dtypes import resolve_dtype
from keel.engine.errors import RequestValidationError
from keel.engine.model_loader import load_model
from keel.engine.model_runner import ModelRunner, StepResult, step_cost
from keel.engine.output import EngineMetrics, GenerateStats, Logprob, RequestOutput, request_output
from keel.engine.sampling_params import SamplingParams, bad_words_token_ids
from keel.engine.scheduler import Scheduler, SchedulerOutput
from keel.engine.sequence import FinishReason, Sequence
from keel.hf.config import ModelConfig, read_config_json
from keel.hf.resolve import resolve_model
from keel.hf.tokenizer import IncrementalDetokenizer, Tokenizer
from keel.layers.fp8_linear import check_quantization
from keel.layers.sampler import NOTHING_ALLOWED, RowLogprobs
from keel.models import get_model_class
from keel.structured import GrammarCompiler

log = logging.getLogger("keel.engine")


class LLMEngine:
    """A loaded model, its tokenizer, the model runner (and the K/V tensors) and the scheduler (and the
    KV-cache bookkeeping)."""

    def __init__(self, model: str | None = None, **settings: Any) -> None:
        """`settings` are `EngineConfig`'s fields, validated there before anything is resolved or loaded."""
        cfg = self.engine_config = EngineConfig.of("LLMEngine", model, **settings)
        host_memory.wanted()  # an unknown KEEL_HUGE_PAGES is refused before anything is read or loaded
        self.model_id = cfg.model
        self.folder = resolve_model(cfg.model, cfg.revision)
        raw = read_config_json(self.folder / "config.json")
        get_model_class((raw.get("architectures") or ["<missing>"])[0])  # unsupported: fail before parsing
        self.config = ModelConfig.from_dict(raw)
        self.device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        self.quantization = check_quantization(cfg.quantization)
        self.tokenizer = Tokenizer(self.folder)
        self.model = load_model(
            self.folder,
            self.config,
            self.dtype,
            self.device,
            progress=cfg.progress,
            kv_cache_bytes=cfg.max_kv_cache_bytes,
        )
        self.runner = ModelRunner(
            self.model, cfg.block_size, cpu_prepack=cfg.cpu_prepack, quantization=self.quantization
        )
        self.scheduler = Scheduler(
            block_size=cfg.block_size,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_num_blocks=max(1, cfg.max_kv_cache_bytes // self.runner.kv_bytes_per_block()),
            enable_prefix_caching=cfg.enable_prefix_caching,
            cost=step_cost(self.config, self.runner.device.type),
        )
        self._max_kv_cache_bytes = cfg.max_kv_cache_bytes
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids or self.config.eos_token_ids)
        self.stats = GenerateStats()
        self._requests: dict[str, Sequence] = {}
        self._aborted: list[RequestOutput] = []  # reported by the next step
        self._num_generation_tokens = 0
        self._inside = threading.Lock()  # held while a thread mutates the engine (see _exclusive)
        self._inside_thread: str | None = None
        self._grammars: GrammarCompiler | None = None  # built on the first structured request
        self._grammars_lock = threading.Lock()  # make_sequence may run on another thread than step
        self._token_text: dict[int, str] = {}  # decoded_token of logprobs, one decode per token id

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLMEngine:
        """An engine built with `config`."""
        return cls(**config.to_dict())

    @contextlib.contextmanager
    def _exclusive(self, op: str) -> Iterator[None]:
        """Fail fast when a second thread enters while one is inside (the engine is not thread-safe)."""
        if not self._inside.acquire(blocking=False):
            raise RuntimeError(
                f"LLMEngine.{op}: called from thread {threading.current_thread().name!r} while thread "
                f"{self._inside_thread!r} is inside the engine; LLMEngine is not thread-safe: drive it from "
                f"one thread (keel serve's AsyncEngine does), or call LLM.generate, which serializes callers"
            )
        self._inside_thread = threading.current_thread().name
        try:
            yield
        finally:
            self._inside_thread = None
            self._inside.release()

    @property
    def max_num_seqs(self) -> int:
        return self.scheduler.max_num_seqs

    @max_num_seqs.setter
    def max_num_seqs(self, value: int) -> None:
        self.engine_config = EngineConfig(**{**self.engine_config.to_dict(), "max_num_seqs": value})  # validated
        self.scheduler.max_num_seqs = value

    @property
    def max_kv_cache_bytes(self) -> int:
        """The KV pool's budget; the pool grows to it on demand."""
        return self._max_kv_cache_bytes

    @max_kv_cache_bytes.setter
    def max_kv_cache_bytes(self, value: int) -> None:
        self.engine_config = EngineConfig(**{**self.engine_config.to_dict(), "max_kv_cache_bytes": value})
        self._max_kv_cache_bytes = value
        self.scheduler.max_num_blocks = max(1, value // self.runner.kv_bytes_per_block())

    def max_kv_blocks(self) -> int:
        """Pool capacity in blocks under `max_kv_cache_bytes` (the pool grows to it on demand)."""
        return self.scheduler.max_num_blocks

    def make_sequence(self, label: str, prompt: str | list[int], params: SamplingParams) -> Sequence:
        """Tokenize and validate one request; `label` names it in errors."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        limit = self.config.max_position_embeddings
        if not ids:
            raise RequestValidationError("prompt", f"{label} is empty after tokenization; expected at least one token")
        if min(ids) < 0 or max(ids) >= self.config.vocab_size:
            raise RequestValidationError(
                "prompt", f"{label} has token ids outside [0, {self.config.vocab_size}) (the vocabulary)"
            )
        room = limit if params.max_tokens == 0 else limit - 1  # a scoring request generates nothing
        if len(ids) > room:
            raise RequestValidationError(
                "prompt",
                f"{label} has {len(ids)} tokens; the model's context is {limit} tokens "
                f"(max_position_embeddings), so at most {room} prompt tokens fit",
            )
        self._check_token_ids(label, params)
        max_len = min(len(ids) + params.max_tokens, limit)
        need, budget = self.scheduler.block_manager.blocks_for(max_len), self.max_kv_blocks()
        if need > budget:
            raise RequestValidationError(
                "max_tokens",
                f"{label} needs {need} KV blocks ({max_len} tokens) but max_kv_cache_bytes allows {budget}; "
                f"raise max_kv_cache_bytes or lower max_tokens",
            )
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(params.seed)
        seq = Sequence(
            prompt=prompt if isinstance(prompt, str) else None,
            prompt_token_ids=ids,
            params=params,
            max_len=max_len,
            detok=IncrementalDetokenizer(self.tokenizer, ids, skip_special_tokens=params.skip_special_tokens),
            generator=gen,
        )
        if params.bad_words_token_ids is not None:
            seq.bad_words_ids = params.bad_words_token_ids  # tokenized once per request by its caller
        elif params.bad_words:
            seq.bad_words_ids = bad_words_token_ids(
                params.bad_words, lambda texts: self.tokenizer.encode_batch(texts, add_special_tokens=False)
            )
        if params.structured_outputs is not None:
            spec = params.structured_outputs
            seq.matcher = self.grammars().matcher(spec.kind, getattr(spec, spec.kind))
            if params.allowed_token_ids is not None:
                self._check_grammar_allows(label, seq)
        return seq

    def grammars(self) -> GrammarCompiler:
        """The structured-outputs compiler (llguidance), built on first use."""
        with self._grammars_lock:
            if self._grammars is None:
                self._grammars = GrammarCompiler(
                    self.folder / "tokenizer.json", self.config.vocab_size, sorted(self.eos_token_ids)
                )
            return self._grammars

    def _check_token_ids(self, label: str, params: SamplingParams) -> None:
        vocab = self.config.vocab_size
        for name, ids in (
            ("logit_bias", list(params.logit_bias or ())),
            ("allowed_token_ids", params.allowed_token_ids or []),
            ("stop_token_ids", params.stop_token_ids or []),
        ):
            bad = [t for t in ids if t >= vocab]
            if bad:
                raise RequestValidationError(
                    name,
                    f"SamplingParams: {name} of {label} has token ids {bad[:5]} outside [0, {vocab}) (the vocabulary)",
                )

    def _check_grammar_allows(self, label: str, seq: Sequence) -> None:
        """A request whose grammar allows none of its allowed_token_ids (less its one-token bad words) at the
        first token can never be sampled: refuse it now, naming both fields."""
        mask = self.grammars().bitmask([seq.matcher])[0].tolist()
        never = {w[0] for w in seq.bad_words_ids if len(w) == 1}
        ids = seq.params.allowed_token_ids or []
        if not any(t not in never and (mask[t >> 5] >> (t & 31)) & 1 for t in ids if t < self.config.vocab_size):
            raise RequestValidationError(
                "allowed_token_ids",
                f"{label}: allowed_token_ids and structured_outputs leave no token to sample: the grammar allows "
                f"none of the allowed tokens as the first token",
            )

    def _conflict(self, seq: Sequence) -> tuple[str, str]:
        """The request's fields whose masks left nothing to sample at this step: (message, first field)."""
        p, out = seq.params, len(seq.output_ids)
        fields = [
            name
            for name, used in (
                ("allowed_token_ids", p.allowed_token_ids is not None),
                ("bad_words", bool(seq.bad_words_ids)),
                ("min_tokens", out < p.min_tokens and seq.matcher is None),
                ("structured_outputs", seq.matcher is not None),
            )
            if used
        ]
        why = ""
        if seq.matcher is not None and seq.matcher.is_error():
            why = f" (the grammar's matcher stopped: {seq.matcher.get_error()})"
        fields = fields or ["prompt"]
        return f"nothing can be sampled at output token {out + 1}: {', '.join(fields)} leave no token{why}", fields[0]

    def decoded_token(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def _logprob_dict(self, row: RowLogprobs) -> dict[int, Logprob]:
        """The sampled (or prompt) token first, then the top k by rank (vLLM's order)."""
        out = {row.token_id: Logprob(row.logprob, row.rank, self.decoded_token(row.token_id))}
        for rank, (tid, lp) in enumerate(zip(row.top_ids, row.top_logprobs, strict=True), start=1):
            if tid not in out:
                out[tid] = Logprob(lp, rank, self.decoded_token(tid))
        return out

    def add_sequence(self, request_id: str, seq: Sequence, *, client: str | None = None) -> None:
        """Queue a sequence made by `make_sequence` under `request_id`, for `client` (the scheduler shares slots
        and prefill among clients; None: the anonymous one)."""
        with self._exclusive("add_request"):
            if request_id in self._requests:
                raise ValueError(f"request id {request_id!r} is already in use by an unfinished request")
            seq.request_id, seq.start_s, seq.client = request_id, time.perf_counter(), client
            self._requests[request_id] = seq
            self.scheduler.add(seq)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        *,
        client: str | None = None,
    ) -> None:
        """Queue a prompt (text or token ids) from `client` (see `add_sequence`); it joins the batch at the next
        step."""
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use by an unfinished request")
        seq = self.make_sequence(f"request {request_id!r}", prompt, params or SamplingParams())
        self.add_sequence(request_id, seq, client=client)

    def abort_request(self, request_id: str, *, report: bool = True) -> None:
        """Stop a request and free its blocks now; the next step reports it with finish_reason "abort"
        (`report=False`: nobody waits for it, drop it silently). Unknown or finished ids are ignored."""
        with self._exclusive("abort_request"):
            seq = self._requests.pop(request_id, None)
            if seq is None:
                return
            self.scheduler.finish(seq)
            seq.finish, seq.end_s = FinishReason.ABORT, time.perf_counter()
            if report:
                self._aborted.append(request_output(seq, [], ""))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._aborted)

    def metrics(self) -> EngineMetrics:
        s = self.scheduler
        return EngineMetrics(
            num_running=len(s.running),
            num_waiting=len(s.waiting),
            kv_blocks_used=s.block_manager.num_used,
            kv_blocks_total=s.max_num_blocks,
            prompt_tokens_total=s.num_prompt_tokens,
            generation_tokens_total=self._num_generation_tokens,
            num_preemptions=s.num_preemptions,
            prefix_cache_queries=s.prefix_cache_queries,
            prefix_cache_hits=s.prefix_cache_hits,
        )

    def step(self) -> list[RequestOutput]:
        """Run one step; one output per request that got a token or finished (aborts included)."""
        with self._exclusive("step"):
            outputs, self._aborted = self._aborted, []
            batch = self.scheduler.schedule()
            if not batch.seqs:
                return outputs
            self.runner.fit_kv_cache(batch.num_kv_blocks)  # growing the pool is not step time (GenerateStats)
            t0 = time.perf_counter()
            self._sampling_inputs(batch)
            result = self.runner.run(batch)
            now = time.perf_counter()
            if batch.num_prompt_tokens:
                self.stats.prefill_tokens += batch.num_prompt_tokens
                self.stats.prefill_s += now - t0
            else:
                self.stats.decode_tokens += len(batch.seqs)
                self.stats.decode_s += now - t0
            return outputs + self._postprocess(batch, result, now)

    def _sampling_inputs(self, batch: SchedulerOutput) -> None:
        """What the sampler needs beyond the parameters, for the sequences that use it: tokens banned this
        step (eos and stop_token_ids before min_tokens, bad words' next tokens) and the grammars' bitmask."""
        banned: list[list[int]] | None = None
        rows = []
        for r in batch.sample_rows:  # (a prompt chunk that does not reach its end samples nothing)
            seq = batch.seqs[r]
            p = seq.params
            if seq.matcher is not None:
                rows.append(r)
            if not (p.min_tokens or seq.bad_words_ids):
                continue
            ban: list[int] = []
            out = seq.output_ids
            if len(out) < p.min_tokens and seq.matcher is None:  # a grammar decides when its output may end
                ban += sorted(self.eos_token_ids) + list(p.stop_token_ids or ())
            for words in seq.bad_words_ids:
                if len(words) == 1 or (len(out) >= len(words) - 1 and out[len(out) - len(words) + 1 :] == words[:-1]):
                    ban.append(words[-1])
            if ban:
                banned = banned or [[] for _ in batch.seqs]
                banned[r] = ban
        batch.banned = banned
        batch.bitmask_rows = rows
        batch.bitmask = self.grammars().bitmask([batch.seqs[r].matcher for r in rows]) if rows else None

    def _postprocess(self, batch: SchedulerOutput, result: StepResult, now: float) -> list[RequestOutput]:
        """After the forward pass, in one place: commit the computed blocks, record prompt logprobs, append
        each token (with its logprobs), check the stops, detokenize, and finish the requests that ended
        (their blocks freed). A sequence whose prompt chunk does not reach its end reports nothing yet; one
        that failed (in the runner, or here) finishes with finish_reason "error" and the others go on."""
        outputs = []
        for r, seq in enumerate(batch.seqs):
            error = result.errors.get(r)
            new: list[int] = []
            delta = ""
            if error is None:
                try:
                    completes = batch.completes(r)
                    start = seq.num_computed_tokens
                    self.scheduler.commit(seq, batch.num_tokens[r])
                    prompt_rows = result.prompt_logprobs.get(r)
                    if prompt_rows is not None:
                        if start == 0:  # a prefill from the start (again, after a preemption)
                            seq.partial_prompt_logprobs = []
                        seq.partial_prompt_logprobs += (self._logprob_dict(x) for x in prompt_rows)
                    if seq.wants_prompt_logprobs and seq.num_computed_tokens >= seq.num_prompt:
                        seq.prompt_logprobs = [None, *seq.partial_prompt_logprobs]
                        seq.partial_prompt_logprobs = []
                    if not completes:
                        continue  # a prompt chunk: nothing to report yet
                    if seq.params.max_tokens == 0:  # a scoring request: the prompt's logprobs are the answer
                        seq.finish, seq.end_s, seq.first_token_s = FinishReason.LENGTH, now, now
                    else:
                        token = result.token_ids[r]
                        if token is None:
                            raise RuntimeError("the runner returned no token for a sequence that completes its step")
                        new = [token]
                        self._num_generation_tokens += 1
                        row = result.logprobs[r]
                        if row is not None:
                            seq.cumulative_logprob += row.logprob
                            if seq.logprobs is not None:
                                seq.logprobs.append(self._logprob_dict(row))
                        delta = self._append(seq, token, now)
                except Exception as exc:  # noqa: BLE001 - this request fails alone
                    log.warning("request %r failed after its forward pass", seq.request_id, exc_info=True)
                    error, new, delta = f"the engine failed on this request: {exc}", [], ""
            if error == NOTHING_ALLOWED:  # the request's own fields: its client's mistake
                error, seq.error_param = self._conflict(seq)
            if error is not None:
                seq.finish, seq.error, seq.end_s = FinishReason.ERROR, error, now
            if seq.finish is not None:
                self.scheduler.finish(seq)
                del self._requests[seq.request_id]
            outputs.append(request_output(seq, new, delta))
        return outputs

    def _append(self, seq: Sequence, token: int, now: float) -> str:
        """Record one sampled token: advance its grammar, extend the text, check eos / stop tokens / stop
        strings (none before min_tokens) / grammar end / length; the text to release."""
        if not seq.output_ids:
            seq.first_token_s = now
        seq.token_ids.append(token)
        p = seq.params
        holdback = max((len(s) for s in p.stop), default=1) - 1  # a stop string may still be forming
        may_stop = len(seq.output_ids) > p.min_tokens
        grammar_done = False
        if seq.matcher is not None:
            ok = seq.matcher.consume_token(token)
            if seq.matcher.is_error():  # stopped by its parser limits (its mask allowed only eos): the grammar's cost
                seq.finish, seq.end_s, seq.error_param = FinishReason.ERROR, now, "structured_outputs"
                seq.error = (
                    f"structured_outputs: the grammar's matcher stopped at output token {len(seq.output_ids)}: "
                    f"{seq.matcher.get_error()}"
                )
                return ""
            grammar_done = not ok or seq.matcher.is_stopped()
        assert seq.detok is not None
        if may_stop and ((token in self.eos_token_ids and not p.ignore_eos) or token in (p.stop_token_ids or ())):
            seq.finish = FinishReason.STOP
            if p.include_stop_str_in_output:
                seq.text += seq.detok.add(token)
        else:
            search_from = max(0, len(seq.text) - holdback)
            seq.text += seq.detok.add(token)
            hits = [(i, s) for s in p.stop if (i := seq.text.find(s, search_from)) >= 0] if may_stop else []
            if hits:
                i, s = min(hits)
                seq.text = seq.text[: i + len(s)] if p.include_stop_str_in_output else seq.text[:i]
                seq.finish = FinishReason.STOP
        if seq.finish is None and grammar_done:
            seq.finish = FinishReason.STOP
        if seq.finish is None and len(seq.token_ids) >= seq.max_len:
            seq.finish = FinishReason.LENGTH
        if seq.finish is not None:
            seq.end_s = now
            holdback = 0
        ready = max(seq.streamed, len(seq.text) - holdback)
        delta, seq.streamed = seq.text[seq.streamed : ready], ready
        return delta
