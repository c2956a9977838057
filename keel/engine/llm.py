"""`LLM`: load a checkpoint once, then `generate` / `chat` with batched paged-cache decoding."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from keel.engine.runner import ModelRunner, load_model
from keel.engine.sampler import sample
from keel.engine.sampling_params import SamplingParams
from keel.engine.sequence import FinishReason, Sequence
from keel.hf.config import ModelConfig, read_config_json
from keel.hf.resolve import DEFAULT_MODEL, resolve_model
from keel.hf.tokenizer import IncrementalDetokenizer, Tokenizer
from keel.models import get_model_class

StreamCallback = Callable[[int, str], None]  # (prompt index, text delta)
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass(slots=True, frozen=True)
class RequestOutput:
    """Result of one prompt: text, token ids, why it stopped and how long it took."""

    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str
    ttft_s: float  # time to first token, from the start of `generate`
    total_s: float


@dataclass(slots=True)
class GenerateStats:
    """Totals of the last `generate` call, split by phase (what the benchmark reports)."""

    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the hardware does it natively, else fp32 (CPU) / fp16 (old GPUs)."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    from keel import _compat  # local: torch's probes are private API, behind keel._compat

    return torch.bfloat16 if _compat.cpu_has_native_bf16() else torch.float32


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; expected one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


class LLM:
    """A loaded model plus tokenizer; `generate` runs many prompts in one batched engine loop."""

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
        progress: bool = True,
        cpu_prepack: bool = True,
    ) -> None:
        self.folder = resolve_model(model, revision)
        raw = read_config_json(self.folder / "config.json")
        get_model_class((raw.get("architectures") or ["<missing>"])[0])  # unsupported: fail before parsing
        self.config = ModelConfig.from_dict(raw)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = resolve_dtype(dtype, self.device)
        self.tokenizer = Tokenizer(self.folder)
        self.model = load_model(self.folder, self.config, self.dtype, self.device, progress=progress)
        self.runner = ModelRunner(self.model, block_size, cpu_prepack=cpu_prepack)
        self.max_num_seqs, self.max_kv_cache_bytes = max_num_seqs, max_kv_cache_bytes
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids or self.config.eos_token_ids)
        self.stats = GenerateStats()

    def _make_seq(self, index: int, prompt: str | list[int], params: SamplingParams) -> Sequence:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        limit = self.config.max_position_embeddings
        if not ids:
            raise ValueError(f"prompt {index} is empty after tokenization; expected at least one token")
        if min(ids) < 0 or max(ids) >= self.config.vocab_size:
            raise ValueError(f"prompt {index} has token ids outside [0, {self.config.vocab_size}) (the vocabulary)")
        if len(ids) >= limit:
            raise ValueError(
                f"prompt {index} has {len(ids)} tokens; the model's context is {limit} tokens "
                f"(max_position_embeddings), so at most {limit - 1} prompt tokens fit"
            )
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(params.seed)
        return Sequence(
            index=index,
            prompt=prompt if isinstance(prompt, str) else None,
            prompt_token_ids=ids,
            params=params,
            max_len=min(len(ids) + params.max_tokens, limit),
            detok=IncrementalDetokenizer(self.tokenizer, ids),
            generator=gen,
        )

    def _ensure_cache(self, seqs: list[Sequence], shuffle_seed: int | None) -> None:
        bm = self.runner.block_manager
        need = sum(bm.blocks_for(s.max_len) for s in seqs[: self.max_num_seqs])
        budget = max(1, self.max_kv_cache_bytes // self.runner.kv_bytes_per_block())
        biggest = max(bm.blocks_for(s.max_len) for s in seqs)
        if biggest > budget:
            raise ValueError(
                f"a request needs {biggest} KV blocks but max_kv_cache_bytes allows {budget}; "
                f"raise max_kv_cache_bytes or lower max_tokens"
            )
        want = min(max(need, biggest), budget)
        if want > self.runner.num_blocks or shuffle_seed is not None:
            self.runner.allocate_kv_cache(max(want, self.runner.num_blocks), shuffle_seed)

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        stream: StreamCallback | None = None,
        shuffle_blocks_seed: int | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); `stream(i, delta)` gets text as it is produced."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        if not prompts:
            return []
        params = sampling_params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(plist)} SamplingParams; expected one or as many")
        seqs = [self._make_seq(i, p, sp) for i, (p, sp) in enumerate(zip(prompts, plist, strict=True))]
        self._ensure_cache(seqs, shuffle_blocks_seed)
        self.stats = GenerateStats()
        start = time.perf_counter()
        for s in seqs:
            s.start_s = start
        try:
            self._run(seqs, stream)
        finally:  # an exception or Ctrl-C mid-run must not leak cache blocks
            for s in seqs:
                if s.block_table:
                    self.runner.block_manager.free(s.block_table)
        return [
            RequestOutput(
                s.prompt,
                s.prompt_token_ids,
                s.text,
                s.output_ids,
                s.finish.value if s.finish else "length",
                s.first_token_s - start,
                s.end_s - start,
            )
            for s in seqs
        ]

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        stream: StreamCallback | None = None,
    ) -> list[RequestOutput]:
        """Render one conversation (or a list of them) with the chat template, then generate."""
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        ids = [self.tokenizer.encode_chat(c) for c in convs]  # type: ignore[arg-type]
        return self.generate(ids, sampling_params, stream=stream)

    def _run(self, seqs: list[Sequence], stream: StreamCallback | None) -> None:
        """Engine loop: admit waiting sequences (prefill) while blocks allow, else decode the running ones."""
        bm = self.runner.block_manager
        waiting, running = deque(seqs), []
        while waiting or running:
            batch: list[Sequence] = []
            while waiting and len(running) + len(batch) < self.max_num_seqs and bm.can_allocate(waiting[0].max_len):
                seq = waiting.popleft()
                seq.block_table = bm.allocate(seq.max_len)
                batch.append(seq)
            prefill = bool(batch)
            if not prefill:
                batch = running
            if not batch:
                raise RuntimeError(
                    f"the KV cache ({bm.num_blocks} blocks) cannot fit the next request "
                    f"({bm.blocks_for(waiting[0].max_len)} blocks)"
                )
            t0 = time.perf_counter()
            logits = self.runner.step(batch, is_prefill=prefill)
            tokens = sample(logits, batch)
            dt = time.perf_counter() - t0
            if prefill:
                self.stats.prefill_tokens += sum(len(s.token_ids) for s in batch)
                self.stats.prefill_s += dt
                running += batch
            else:
                self.stats.decode_tokens += len(batch)
                self.stats.decode_s += dt
            now = time.perf_counter()
            for seq, token in zip(batch, tokens, strict=True):
                self._append(seq, token, now, stream)
            for seq in [s for s in running if s.finish is not None]:
                bm.free(seq.block_table)
                running.remove(seq)

    def _append(self, seq: Sequence, token: int, now: float, stream: StreamCallback | None) -> None:
        """Record one sampled token, extend the text, check eos / stop strings / length, stream."""
        if not seq.output_ids:
            seq.first_token_s = now
        seq.token_ids.append(token)
        p = seq.params
        holdback = max((len(s) for s in p.stop), default=1) - 1  # a stop string may still be forming
        if token in self.eos_token_ids and not p.ignore_eos:
            seq.finish = FinishReason.EOS
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
        ready = len(seq.text) - holdback
        if stream is not None and ready > seq.streamed:
            stream(seq.index, seq.text[seq.streamed : ready])
            seq.streamed = ready
