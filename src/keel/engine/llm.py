"""`LLM`: the offline face of an `LLMEngine`: `generate` / `chat` add every prompt, then step until all finish."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from keel.engine.config import EngineConfig
from keel.engine.llm_engine import LLMEngine
from keel.engine.output import CompletionOutput, GenerateStats, RequestOutput
from keel.engine.sampling_params import SamplingParams
from keel.hf.config import ModelConfig
from keel.hf.tokenizer import Tokenizer
from keel.models.llama import LlamaForCausalLM

StreamCallback = Callable[[int, str], None]  # (prompt index, text delta)


class LLM:
    """A loaded model plus tokenizer; `generate` runs many prompts through its engine (`llm_engine`, whose
    constructor arguments these are) as one batch."""

    _calls = itertools.count()

    def __init__(self, model: str | None = None, **settings: Any) -> None:
        """`settings` are `EngineConfig`'s fields (`dtype="bf16"`, `max_num_seqs=8`, ...); `model=None` loads
        the default model."""
        self.llm_engine = LLMEngine.from_config(EngineConfig.of("LLM", model, **settings))
        self._lock = threading.Lock()  # generate / chat callers on several threads take turns

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        """An `LLM` whose engine is built with `config`."""
        return cls(**config.to_dict())

    # what was loaded (read-only views of the engine's)
    @property
    def model_id(self) -> str:
        return self.llm_engine.model_id

    @property
    def folder(self) -> Path:
        return self.llm_engine.folder

    @property
    def config(self) -> ModelConfig:
        return self.llm_engine.config

    @property
    def tokenizer(self) -> Tokenizer:
        return self.llm_engine.tokenizer

    @property
    def model(self) -> LlamaForCausalLM:
        return self.llm_engine.model

    @property
    def dtype(self) -> torch.dtype:
        return self.llm_engine.dtype

    @property
    def device(self) -> torch.device:
        return self.llm_engine.device

    @property
    def stats(self) -> GenerateStats:
        """Prefill / decode time and tokens of the last `generate` or `chat` call."""
        return self.llm_engine.stats

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        stream: StreamCallback | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); `stream(i, delta)` gets text as it is produced.
        One RequestOutput per prompt; its `outputs` lists the prompt's n completions (SamplingParams.n,
        best first when best_of candidates were ranked by cumulative logprob), and its own fields are those
        of `outputs[0]`.

        Callers on several threads take turns: each call runs its prompts to the end on its own."""
        with self._lock:
            return self._generate(prompts, sampling_params, stream)

    def _generate(
        self,
        prompts: str | list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None,
        stream: StreamCallback | None,
    ) -> list[RequestOutput]:
        engine = self.llm_engine
        batch: list[str | list[int]]
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            batch = [cast("str | list[int]", prompts)]  # one prompt: text or token ids
        else:
            batch = list(prompts)
        if not batch:
            return []
        if engine.has_unfinished_requests():
            raise RuntimeError("LLM.generate: the engine still has unfinished requests (added with add_request)")
        params = sampling_params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(batch)
        if len(plist) != len(batch):
            raise ValueError(f"got {len(batch)} prompts but {len(plist)} SamplingParams; expected one or as many")
        if stream is not None and any(sp.num_candidates > 1 for sp in plist):
            raise ValueError("LLM.generate: stream needs n == 1 and no best_of (one text per prompt)")
        seqs, owner = [], []  # owner[j]: the prompt index of sequence j
        for i, (p, sp) in enumerate(zip(batch, plist, strict=True)):
            for c in range(sp.num_candidates):
                cand = sp
                if c and sp.seed is not None:  # distinct, reproducible seeds per candidate (as keel serve does)
                    cand = dataclasses.replace(sp, seed=(sp.seed + c) % (1 << 63))
                seq = engine.make_sequence(f"prompt {i}", p, cand)
                seq.tracks_logprob = seq.tracks_logprob or sp.num_candidates > 1  # ranked / reported per completion
                seqs.append(seq)
                owner.append(i)
        engine.scheduler.reserve(seqs)  # size the KV pool for the first wave now, not step by step
        call = next(self._calls)
        ids = [f"generate-{call}-{j}" for j in range(len(seqs))]
        index = {rid: owner[j] for j, rid in enumerate(ids)}
        done: dict[str, RequestOutput] = {}
        engine.stats = GenerateStats()
        try:
            for rid, seq in zip(ids, seqs, strict=True):
                engine.add_sequence(rid, seq)
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if stream is not None and out.delta_text:
                        stream(index[out.request_id], out.delta_text)
                    if out.finished:
                        done[out.request_id] = out
        finally:  # an exception or Ctrl-C mid-run must not leak cache blocks (nobody waits for the aborts)
            for rid in ids:
                engine.abort_request(rid, report=False)
        results = []
        for i, sp in enumerate(plist):
            cands = [done[rid] for j, rid in enumerate(ids) if owner[j] == i]
            if sp.best_of is not None and sp.best_of > sp.n:
                cands.sort(key=lambda o: o.cumulative_logprob or 0.0, reverse=True)
            keep = cands[: sp.n]
            outputs = [
                CompletionOutput(k, o.text, o.token_ids, o.cumulative_logprob, o.logprobs, o.finish_reason)
                for k, o in enumerate(keep)
            ]
            results.append(dataclasses.replace(keep[0], outputs=outputs))
        return results

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
