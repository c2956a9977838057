"""`LLMEngine`: requests in (`add_request`, `abort_request`), one step at a time out (`step`).

Each step is schedule -> run -> postprocess: the scheduler picks the sequences and their KV blocks, the
model runner computes them in one varlen forward pass (the new prompts past their cached prefix and the
running decodes) and samples, and `_postprocess` appends each token, checks the stops, detokenizes and
finishes requests. Requests that arrive while others decode join the batch at the next step (continuous
batching). Not thread-safe: drive it from one thread at a time (`keel serve`'s AsyncEngine owns it in one
thread; `LLM.generate` serializes its callers). A call that enters while another thread is inside the
engine raises instead of corrupting the scheduler and the block tables."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import torch

from keel.engine.dtypes import resolve_dtype
from keel.engine.model_loader import load_model
from keel.engine.model_runner import ModelRunner
from keel.engine.output import EngineMetrics, GenerateStats, RequestOutput, request_output
from keel.engine.sampling_params import SamplingParams
from keel.engine.scheduler import Scheduler
from keel.engine.sequence import FinishReason, Sequence
from keel.hf.config import ModelConfig, read_config_json
from keel.hf.resolve import DEFAULT_MODEL, resolve_model
from keel.hf.tokenizer import IncrementalDetokenizer, Tokenizer
from keel.layers.fp8_linear import check_quantization
from keel.models import get_model_class


class LLMEngine:
    """A loaded model, its tokenizer, the model runner (and the K/V tensors) and the scheduler (and the
    KV-cache bookkeeping)."""

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
        self.model_id = model
        self.folder = resolve_model(model, revision)
        raw = read_config_json(self.folder / "config.json")
        get_model_class((raw.get("architectures") or ["<missing>"])[0])  # unsupported: fail before parsing
        self.config = ModelConfig.from_dict(raw)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = resolve_dtype(dtype, self.device)
        self.quantization = check_quantization(quantization)
        self.tokenizer = Tokenizer(self.folder)
        self.model = load_model(self.folder, self.config, self.dtype, self.device, progress=progress)
        self.runner = ModelRunner(self.model, block_size, cpu_prepack=cpu_prepack, quantization=self.quantization)
        self.scheduler = Scheduler(
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_blocks=max(1, max_kv_cache_bytes // self.runner.kv_bytes_per_block()),
            enable_prefix_caching=enable_prefix_caching,
        )
        self._max_kv_cache_bytes = max_kv_cache_bytes
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids or self.config.eos_token_ids)
        self.stats = GenerateStats()
        self._requests: dict[str, Sequence] = {}
        self._aborted: list[RequestOutput] = []  # reported by the next step
        self._num_generation_tokens = 0
        self._inside = threading.Lock()  # held while a thread mutates the engine (see _exclusive)
        self._inside_thread: str | None = None

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

    @property
    def max_kv_cache_bytes(self) -> int:
        """The KV pool's budget; the pool grows to it on demand."""
        return self._max_kv_cache_bytes

    @max_kv_cache_bytes.setter
    def max_kv_cache_bytes(self, value: int) -> None:
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
            raise ValueError(f"{label} is empty after tokenization; expected at least one token")
        if min(ids) < 0 or max(ids) >= self.config.vocab_size:
            raise ValueError(f"{label} has token ids outside [0, {self.config.vocab_size}) (the vocabulary)")
        if len(ids) >= limit:
            raise ValueError(
                f"{label} has {len(ids)} tokens; the model's context is {limit} tokens "
                f"(max_position_embeddings), so at most {limit - 1} prompt tokens fit"
            )
        max_len = min(len(ids) + params.max_tokens, limit)
        need, budget = self.scheduler.block_manager.blocks_for(max_len), self.max_kv_blocks()
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
            tokens = self.runner.run(batch)
            now = time.perf_counter()
            if batch.num_prompt_tokens:
                self.stats.prefill_tokens += batch.num_prompt_tokens
                self.stats.prefill_s += now - t0
            else:
                self.stats.decode_tokens += len(batch.seqs)
                self.stats.decode_s += now - t0
            self._num_generation_tokens += len(batch.seqs)
            return outputs + self._postprocess(batch.seqs, tokens, now)

    def _postprocess(self, seqs: list[Sequence], tokens: list[int], now: float) -> list[RequestOutput]:
        """After the forward pass, in one place: commit the computed blocks, append each token, check the
        stops, detokenize, and finish the requests that ended (their blocks freed)."""
        outputs = []
        for seq, token in zip(seqs, tokens, strict=True):
            self.scheduler.commit(seq)
            delta = self._append(seq, token, now)
            if seq.finish is not None:
                self.scheduler.finish(seq)
                del self._requests[seq.request_id]
            outputs.append(request_output(seq, [token], delta))
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
