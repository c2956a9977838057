"""`LLMEngine`: requests in (`add_request`, `abort_request`), one scheduler step at a time out (`step`).

Requests that arrive while others decode join the batch at the next step (continuous batching); every
step is one varlen forward pass over the new prompts (past their cached prefix) and the running decodes.
Not thread-safe: drive it from one thread at a time (`keel serve`'s AsyncEngine owns it in one thread;
`LLM.generate` serializes its callers). A call that enters while another thread is inside the engine
raises instead of corrupting the scheduler and the block tables."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from keel.engine.fp8_linear import check_quantization, quantize_linears
from keel.engine.runner import ModelRunner, load_model
from keel.engine.sampler import sample
from keel.engine.sampling_params import SamplingParams
from keel.engine.scheduler import Scheduler
from keel.engine.sequence import FinishReason, Sequence
from keel.hf.config import ModelConfig, read_config_json
from keel.hf.resolve import DEFAULT_MODEL, resolve_model
from keel.hf.tokenizer import IncrementalDetokenizer, Tokenizer
from keel.models import get_model_class


@dataclass(slots=True, frozen=True)
class RequestOutput:
    """A request's state after a step: everything so far plus what this step added."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str  # all text released so far (a possible stop string's prefix is held back until decided)
    token_ids: list[int]  # all output tokens so far
    delta_text: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop" (eos or stop string), "length", "abort"; None while running
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    ttft_s: float  # time to first token, from add_request
    total_s: float  # from add_request to this output


@dataclass(slots=True, frozen=True)
class EngineMetrics:
    """Counters for monitoring; `kv_blocks_total` is the capacity max_kv_cache_bytes allows."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    num_preemptions: int
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # of those, tokens served from it


@dataclass(slots=True)
class GenerateStats:
    """Time and tokens by phase: steps with any prompt work count as prefill, the others as decode."""

    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0


class LLMEngine:
    """A loaded model, its tokenizer, the paged KV cache and the scheduler."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        dtype: str | torch.dtype | None = None,
        device: str | None = None,
        revision: str | None = None,
        block_size: int = 16,
        max_num_seqs: int = 64,
        max_kv_cache_bytes: int = 4 << 30,
        max_num_batched_tokens: int = 8192,
        enable_prefix_caching: bool = True,
        progress: bool = True,
        cpu_prepack: bool = False,
        quantization: str | None = None,
    ) -> None:
        from keel.engine.llm import resolve_dtype  # llm.py builds on this module

        self.model_id = model
        self.folder = resolve_model(model, revision)
        raw = read_config_json(self.folder / "config.json")
        get_model_class((raw.get("architectures") or ["<missing>"])[0])  # unsupported: fail before parsing
        self.config = ModelConfig.from_dict(raw)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = resolve_dtype(dtype, self.device)
        self.tokenizer = Tokenizer(self.folder)
        self.model = load_model(self.folder, self.config, self.dtype, self.device, progress=progress)
        self.quantization = check_quantization(quantization)
        if self.quantization == "fp8":  # FP8 weights through the vendored fp8_gemm_nt (keel/engine/fp8_linear.py)
            quantize_linears(self.model)
        self.runner = ModelRunner(self.model, block_size, cpu_prepack, enable_prefix_caching)
        self.scheduler = Scheduler(max_num_seqs, max_num_batched_tokens)
        self.max_kv_cache_bytes = max_kv_cache_bytes
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids or self.config.eos_token_ids)
        self.stats = GenerateStats()
        self._requests: dict[str, Sequence] = {}
        self._aborted: list[RequestOutput] = []  # reported by the next step
        self._totals = {"prompt": 0, "generation": 0, "queries": 0, "hits": 0}
        self._inside = threading.Lock()  # held while a thread mutates the engine (see _exclusive)
        self._inside_thread: str | None = None
        self._generate_lock = threading.Lock()  # LLM.generate / chat callers on several threads take turns

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
        self.scheduler.max_num_seqs = value

    def max_kv_blocks(self) -> int:
        """Pool capacity in blocks under `max_kv_cache_bytes` (the pool grows to it on demand)."""
        return max(1, self.max_kv_cache_bytes // self.runner.kv_bytes_per_block())

    def make_sequence(self, label: str, prompt: str | list[int], params: SamplingParams) -> Sequence:
        """Tokenize and validate one request; `label` names it in errors."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        limit = self.config.max_position_embeddings
        if not ids:
            raise ValueError(f"{label} is empty after tokenization; expected at least one token")
        if min(ids) < 0 or max(ids) >= self.config.vocab_size:
            raise ValueError(f"{label} has token ids outside [0, {self.config.vocab_size}) (the vocabulary)")
        if len(ids) >= limit:
            raise ValueError(
                f"{label} has {len(ids)} tokens; the model's context is {limit} tokens "
                f"(max_position_embeddings), so at most {limit - 1} prompt tokens fit"
            )
        max_len = min(len(ids) + params.max_tokens, limit)
        need, budget = self.runner.block_manager.blocks_for(max_len), self.max_kv_blocks()
        if need > budget:
            raise ValueError(
                f"{label} needs {need} KV blocks ({max_len} tokens) but max_kv_cache_bytes allows {budget}; "
                f"raise max_kv_cache_bytes or lower max_tokens"
            )
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(params.seed)
        return Sequence(
            index=0,
            prompt=prompt if isinstance(prompt, str) else None,
            prompt_token_ids=ids,
            params=params,
            max_len=max_len,
            detok=IncrementalDetokenizer(self.tokenizer, ids),
            generator=gen,
        )

    def add_sequence(self, request_id: str, seq: Sequence) -> None:
        """Queue a sequence made by `make_sequence` under `request_id`."""
        with self._exclusive("add_request"):
            if request_id in self._requests:
                raise ValueError(f"request id {request_id!r} is already in use by an unfinished request")
            seq.request_id, seq.start_s = request_id, time.perf_counter()
            self._requests[request_id] = seq
            self.scheduler.add(seq)

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None) -> None:
        """Queue a prompt (text or token ids); it joins the batch at the next step."""
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use by an unfinished request")
        self.add_sequence(request_id, self.make_sequence(f"request {request_id!r}", prompt, params or SamplingParams()))

    def abort_request(self, request_id: str) -> None:
        """Stop a request and free its blocks now; the next step reports it with finish_reason "abort".
        Unknown or finished ids are ignored."""
        with self._exclusive("abort_request"):
            seq = self._requests.pop(request_id, None)
            if seq is None:
                return
            self.scheduler.remove(seq)
            self.runner.block_manager.release(seq)
            seq.finish, seq.end_s = FinishReason.ABORT, time.perf_counter()
            self._aborted.append(self._output(seq, [], ""))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._aborted)

    def metrics(self) -> EngineMetrics:
        t = self._totals
        return EngineMetrics(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_blocks_used=self.runner.block_manager.num_used,
            kv_blocks_total=self.max_kv_blocks(),
            prompt_tokens_total=t["prompt"],
            generation_tokens_total=t["generation"],
            num_preemptions=self.scheduler.num_preemptions,
            prefix_cache_queries=t["queries"],
            prefix_cache_hits=t["hits"],
        )

    def _grow_pool(self, want: int) -> bool:
        """Grow the KV pool (at least doubling, capped by max_kv_cache_bytes); False when already full size."""
        have, cap = self.runner.num_blocks, self.max_kv_blocks()
        if have >= cap:
            return False
        self.runner.grow_kv_cache(min(cap, max(2 * have, have + want)))
        return True

    def step(self) -> list[RequestOutput]:
        """Run one scheduler step; one output per request that got a token or finished (aborts included)."""
        with self._exclusive("step"):
            return self._step()

    def _step(self) -> list[RequestOutput]:
        outputs, self._aborted = self._aborted, []
        bm = self.runner.block_manager
        seqs = self.scheduler.schedule(bm, self._grow_pool)
        if not seqs:
            if self.scheduler.waiting:
                raise RuntimeError(
                    f"the KV cache ({bm.num_blocks} blocks) cannot fit the next request "
                    f"({bm.blocks_for(len(self.scheduler.waiting[0].token_ids))} blocks)"
                )
            return outputs
        for seq in seqs:
            if seq.num_cached_tokens < 0:  # first admission: count the prompt and its prefix-cache hit
                seq.num_cached_tokens = seq.num_computed_tokens
                self._totals["prompt"] += seq.num_prompt
                self._totals["queries"] += seq.num_prompt
                self._totals["hits"] += seq.num_cached_tokens
        prompt_work = sum(s.num_new_tokens for s in seqs if s.num_new_tokens > 1 or not s.output_ids)
        t0 = time.perf_counter()
        tokens = sample(self.runner.step(seqs), seqs)
        now = time.perf_counter()
        if prompt_work:
            self.stats.prefill_tokens += prompt_work
            self.stats.prefill_s += now - t0
        else:
            self.stats.decode_tokens += len(seqs)
            self.stats.decode_s += now - t0
        self._totals["generation"] += len(seqs)
        for seq, token in zip(seqs, tokens, strict=True):
            seq.num_computed_tokens = len(seq.token_ids)
            bm.commit(seq)
            delta = self._append(seq, token, now)
            if seq.finish is not None:
                self.scheduler.remove(seq)
                bm.release(seq)
                del self._requests[seq.request_id]
            outputs.append(self._output(seq, [token], delta))
        return outputs

    def _append(self, seq: Sequence, token: int, now: float) -> str:
        """Record one sampled token: extend the text, check eos / stop strings / length; the text to release."""
        if not seq.output_ids:
            seq.first_token_s = now
        seq.token_ids.append(token)
        p = seq.params
        holdback = max((len(s) for s in p.stop), default=1) - 1  # a stop string may still be forming
        if token in self.eos_token_ids and not p.ignore_eos:
            seq.finish = FinishReason.STOP
        else:
            assert seq.detok is not None
            search_from = max(0, len(seq.text) - holdback)
            seq.text += seq.detok.add(token)
            hits = [i for s in p.stop if (i := seq.text.find(s, search_from)) >= 0]
            if hits:
                seq.text = seq.text[: min(hits)]
                seq.finish = FinishReason.STOP
        if seq.finish is None and len(seq.token_ids) >= seq.max_len:
            seq.finish = FinishReason.LENGTH
        if seq.finish is not None:
            seq.end_s = now
            holdback = 0
        ready = max(seq.streamed, len(seq.text) - holdback)
        delta, seq.streamed = seq.text[seq.streamed : ready], ready
        return delta

    def _output(self, seq: Sequence, new_token_ids: list[int], delta: str) -> RequestOutput:
        end = seq.end_s if seq.finish is not None else time.perf_counter()
        return RequestOutput(
            request_id=seq.request_id,
            prompt=seq.prompt,
            prompt_token_ids=seq.prompt_token_ids,
            text=seq.text[: seq.streamed],
            token_ids=seq.output_ids,
            delta_text=delta,
            new_token_ids=new_token_ids,
            finished=seq.finish is not None,
            finish_reason=seq.finish.value if seq.finish is not None else None,
            num_cached_tokens=max(seq.num_cached_tokens, 0),
            ttft_s=(seq.first_token_s - seq.start_s) if seq.first_token_s else 0.0,
            total_s=end - seq.start_s,
        )
