"""`LLM`: the offline face of `LLMEngine`: `generate` / `chat` add every prompt, then step until all finish."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from keel.engine.core import GenerateStats, LLMEngine, RequestOutput
from keel.engine.sampling_params import SamplingParams
from keel.engine.sequence import Sequence

StreamCallback = Callable[[int, str], None]  # (prompt index, text delta)
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


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


class LLM(LLMEngine):
    """A loaded model plus tokenizer; `generate` runs many prompts through the engine as one batch."""

    _calls = itertools.count()

    def _ensure_cache(self, seqs: list[Sequence], shuffle_seed: int | None) -> None:
        """Size the pool once for the first wave (capped by max_kv_cache_bytes) instead of growing it step by step."""
        bm = self.runner.block_manager
        need = sum(bm.blocks_for(s.max_len) for s in seqs[: self.max_num_seqs])
        want = min(max(need, max(bm.blocks_for(s.max_len) for s in seqs)), self.max_kv_blocks())
        if shuffle_seed is not None:
            self.runner.allocate_kv_cache(max(want, self.runner.num_blocks), shuffle_seed)
        elif want > self.runner.num_blocks:
            self.runner.grow_kv_cache(want)

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        stream: StreamCallback | None = None,
        shuffle_blocks_seed: int | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); `stream(i, delta)` gets text as it is produced.

        Callers on several threads take turns: each call runs its prompts to the end on its own."""
        with self._generate_lock:
            return self._generate(prompts, sampling_params, stream, shuffle_blocks_seed)

    def _generate(self, prompts, sampling_params, stream, shuffle_blocks_seed) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not prompts:
            return []
        if self.has_unfinished_requests():
            raise RuntimeError("LLM.generate: the engine still has unfinished requests (added with add_request)")
        params = sampling_params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(plist)} SamplingParams; expected one or as many")
        seqs = [self.make_sequence(f"prompt {i}", p, sp) for i, (p, sp) in enumerate(zip(prompts, plist, strict=True))]
        self._ensure_cache(seqs, shuffle_blocks_seed)
        call = next(self._calls)
        ids = [f"generate-{call}-{i}" for i in range(len(seqs))]
        index = {rid: i for i, rid in enumerate(ids)}
        done: dict[str, RequestOutput] = {}
        self.stats = GenerateStats()
        try:
            for rid, seq in zip(ids, seqs, strict=True):
                self.add_sequence(rid, seq)
            while self.has_unfinished_requests():
                for out in self.step():
                    if stream is not None and out.delta_text:
                        stream(index[out.request_id], out.delta_text)
                    if out.finished:
                        done[out.request_id] = out
        finally:  # an exception or Ctrl-C mid-run must not leak cache blocks
            for rid in ids:
                self.abort_request(rid)
            self._aborted = [o for o in self._aborted if o.request_id not in index]
        return [done[rid] for rid in ids]

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
