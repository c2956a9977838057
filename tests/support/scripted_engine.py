"""A scripted engine behind the real server: the real model's config and tokenizer, but `step` releases a
fixed list of text pieces (one token each) with made-up logprobs, so tests can check how the server
shapes what an engine returns (tool-call parsing, logprob layouts) without depending on what a random
model happens to write. The values are invented: tests built on it check shapes and mapping only."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FakeLogprob:
    logprob: float
    rank: int
    decoded_token: str


@dataclass
class FakeOutput:
    request_id: str
    prompt: Any
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    delta_text: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    num_cached_tokens: int = 0
    ttft_s: float = 0.0
    total_s: float = 0.0
    logprobs: list | None = None
    new_logprobs: list | None = None
    prompt_logprobs: list | None = None


def step_logprobs(token_id: int, text: str, k: int) -> dict[int, FakeLogprob]:
    """The sampled token at rank 2 (so it is not the most likely one) and k alternatives of ranks 1, 3, ..."""
    entries = {token_id: FakeLogprob(-0.5, 2, text)}
    for r in range(k + 1):
        rank = 1 if r == 0 else r + 2
        entries[1000 + 7 * token_id + r] = FakeLogprob(-0.25 * rank, rank, f"<alt{rank}>")
    return entries


@dataclass
class _Req:
    params: Any
    prompt: list[int]
    pos: int = 0
    lps: list = field(default_factory=list)


class ScriptedEngine:
    """`LLMEngine`'s request API over a script of text pieces; config and tokenizer are the real engine's."""

    def __init__(self, real: Any, pieces: list[str], step_s: float = 0.0) -> None:
        import dataclasses

        # a long context: prompts with tool specs outgrow the tiny model's 128 tokens (no model runs here)
        self.config = dataclasses.replace(real.config, max_position_embeddings=4096)
        self.tokenizer, self._real = real.tokenizer, real
        self.pieces, self.step_s = pieces, step_s
        self.requests: dict[str, _Req] = {}
        self.params_seen: list[Any] = []
        self.prompts_seen: list[list[int]] = []

    def add_request(self, request_id: str, prompt: Any, params: Any = None, *, client: str | None = None) -> None:
        self.params_seen.append(params)
        self.prompts_seen.append(list(prompt))
        self.requests[request_id] = _Req(params, list(prompt))

    def abort_request(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def metrics(self) -> Any:
        return self._real.metrics()

    def step(self) -> list[FakeOutput]:
        time.sleep(self.step_s)
        outs = []
        for rid, r in list(self.requests.items()):
            p = r.params
            k = getattr(p, "logprobs", None)
            pk = getattr(p, "prompt_logprobs", None)
            first = r.pos == 0
            n = min(len(self.pieces), p.max_tokens)
            new_ids, delta = ([], "") if r.pos >= n else ([10 + r.pos], self.pieces[r.pos])
            if new_ids:
                r.pos += 1
                if k is not None:
                    r.lps.append(step_logprobs(new_ids[0], delta, k))
            done = r.pos >= n
            ids = [10 + i for i in range(r.pos)]
            prompt_lps = None
            if first and pk is not None:
                prompt_lps = [None] + [
                    step_logprobs(t, self.tokenizer.decode([t], skip_special_tokens=False), pk) for t in r.prompt[1:]
                ]
            outs.append(
                FakeOutput(
                    request_id=rid,
                    prompt=None,
                    prompt_token_ids=r.prompt,
                    text="".join(self.pieces[: r.pos]),
                    token_ids=ids,
                    delta_text=delta,
                    new_token_ids=new_ids,
                    finished=done,
                    finish_reason=("length" if n < len(self.pieces) else "stop") if done else None,
                    logprobs=list(r.lps) if k is not None else None,
                    new_logprobs=r.lps[-len(new_ids) :]
                    if (k is not None and new_ids)
                    else ([] if k is not None else None),
                    prompt_logprobs=prompt_lps,
                )
            )
            if done:
                del self.requests[rid]
        return outs


def start_scripted(tiny_model: Any, pieces: list[str], **kwargs: Any) -> Any:
    """A real server over a ScriptedEngine (the tiny checkpoint's config and tokenizer)."""
    from keel.engine.async_engine import AsyncEngine
    from keel.entrypoints.openai.api_server import ServerThread, build_app
    from keel.entrypoints.openai.server_config import ServerConfig
    from support.serve import MODEL_NAME, Served, make_engine

    fake = ScriptedEngine(make_engine(tiny_model), pieces, **kwargs)
    engine = AsyncEngine(fake, max_admitted=64)
    # the tool tests send their own chat_template (the tiny model's renders no tools): the operator's choice
    app = build_app(
        engine, model_name=MODEL_NAME, limits=ServerConfig(max_tokens=512), trust_request_chat_template=True
    )
    return Served(ServerThread(app).start(), engine), fake
