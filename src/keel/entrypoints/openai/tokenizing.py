"""Tokenizing for the server, off the event loop and the engine thread (`TokenizerPool`).

`tokenizers` holds the GIL for a whole single `encode` (a thread of the default executor does not free
the event loop) but releases it in its batch calls, so the pool's own threads call those. Before any
tokenizer call a text is checked against what the context could hold: where the tokenizer makes it a
bound (`Tokenizer.max_chars_per_token`), a text longer than that times max_model_len tokenizes to more
tokens than fit, and is a 400 without being tokenized.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from keel.engine.sampling_params import bad_words_token_ids
from keel.entrypoints.openai.errors import APIError, bad_request

T = TypeVar("T")


def _lower_priority() -> None:
    """Nice this thread (Linux keeps a priority per thread): a client's text shares the cores with the engine's
    steps, which come first."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (OSError, AttributeError):
        pass


class TokenizerPool:
    """Encode and decode on `threads` threads of their own (not the default executor, which other work
    shares), at a lower scheduling priority, at most `max_pending` calls queued (more: 503)."""

    def __init__(self, tokenizer: Any, max_model_len: int, *, threads: int = 1, max_pending: int = 64) -> None:
        if threads < 1 or max_pending < 1:
            raise ValueError(f"TokenizerPool: threads and max_pending must be >= 1, got {threads}, {max_pending}")
        self.tokenizer, self.max_model_len, self.max_pending = tokenizer, max_model_len, max_pending
        per_token = getattr(tokenizer, "max_chars_per_token", lambda: None)()
        self.max_chars: int | None = per_token * max_model_len if per_token else None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            threads, thread_name_prefix="keel-tokenize", initializer=_lower_priority
        )
        self._lock = threading.Lock()
        self._pending = 0

    def check_length(self, text: str, field: str) -> None:
        """A 400 for a text longer than `max_model_len` tokens could ever hold."""
        if self.max_chars is not None and len(text) > self.max_chars:
            raise bad_request(
                f"{field} has {len(text)} characters; this model's maximum context length is {self.max_model_len} "
                f"tokens and one token stands for at most {self.max_chars // self.max_model_len} characters, so at "
                f"most {self.max_chars} characters can fit",
                field,
            )

    async def _run(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._pending >= self.max_pending:
                raise APIError(
                    503, f"{self._pending} tokenizer calls are waiting already; retry later", code="server_overloaded"
                )
            self._pending += 1
        try:
            return await asyncio.wrap_future(self._pool.submit(fn))
        finally:
            with self._lock:
                self._pending -= 1

    def _encode_batch(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        batch = getattr(self.tokenizer, "encode_batch", None)
        if batch is not None:
            return list(batch(texts, add_special_tokens=add_special_tokens))
        return [self.tokenizer.encode(t, add_special_tokens=add_special_tokens) for t in texts]

    def _decode_batch(self, seqs: list[list[int]], skip_special_tokens: bool) -> list[str]:
        batch = getattr(self.tokenizer, "decode_batch", None)
        if batch is not None:
            return list(batch(seqs, skip_special_tokens=skip_special_tokens))
        return [self.tokenizer.decode(s, skip_special_tokens=skip_special_tokens) for s in seqs]

    async def encode(
        self, text: str, *, add_special_tokens: bool, field: str = "prompt", bounded: bool = True
    ) -> list[int]:
        """Token ids of `text` (a 400 naming `field` first when it cannot fit, unless `bounded` is False)."""
        if bounded:
            self.check_length(text, field)
        return (await self._run(lambda: self._encode_batch([text], add_special_tokens)))[0]

    async def bad_words(self, words: list[str]) -> list[list[int]]:
        """The token sequences `words` forbid (SamplingParams bounded their count and length), in one call."""
        return await self._run(lambda: bad_words_token_ids(words, lambda texts: self._encode_batch(texts, False)))

    async def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return (await self._run(lambda: self._decode_batch([ids], skip_special_tokens)))[0]

    async def token_strs(self, ids: list[int]) -> list[str]:
        """Each token's own text (special tokens included), as /tokenize's `return_token_strs` shows them."""
        return await self._run(lambda: self._decode_batch([[t] for t in ids], False))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
