"""`Scheduler`: which sequences the next forward pass computes (continuous batching with preemption), and
the owner of the KV-cache bookkeeping: allocation, pool growth, prefix-cache lookup once per admission,
commit of computed blocks, release and preemption all go through it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from keel.engine.block_manager import BlockManager, PrefixHit
from keel.engine.sequence import Sequence


@dataclass(slots=True)
class SchedulerOutput:
    """One step's work: sequence r computes its tokens [num_computed_tokens, num_computed_tokens +
    num_tokens[r]) into the blocks of its table, which index a pool of `num_kv_blocks` blocks. A prompt
    longer than the step's token budget is computed in chunks over several steps (chunked prefill); only a
    sequence whose chunk reaches its last token gets a next token."""

    seqs: list[Sequence]
    num_prompt_tokens: int  # tokens of prompt work (0: a pure decode step)
    num_kv_blocks: int
    num_tokens: list[int] = field(default_factory=list)  # per sequence; empty: all its uncomputed tokens
    # what the engine adds for the sampler before the runner runs the step (None / empty: nothing to do)
    banned: list[list[int]] | None = None  # per sequence: tokens masked this step (min_tokens, bad words)
    bitmask: Any = None  # int32 [len(bitmask_rows), ceil(V/32)]: structured outputs' allowed tokens
    bitmask_rows: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_tokens:
            self.num_tokens = [s.num_new_tokens for s in self.seqs]
        if len(self.num_tokens) != len(self.seqs):
            raise ValueError(
                f"SchedulerOutput: num_tokens needs one entry per sequence ({len(self.seqs)}), "
                f"got {len(self.num_tokens)}"
            )

    def completes(self, r: int) -> bool:
        """Sequence r's chunk reaches its last token: the step gives it logits for its next token."""
        seq = self.seqs[r]
        return seq.num_computed_tokens + self.num_tokens[r] == len(seq.token_ids)

    @property
    def sample_rows(self) -> list[int]:
        """The rows that get a next token this step (a scoring request, max_tokens 0, samples none)."""
        return [r for r, s in enumerate(self.seqs) if self.completes(r) and s.params.max_tokens]

    def subset(self, rows: list[int]) -> SchedulerOutput:
        """The same step for `rows` only (the runner retries a failed batch row by row)."""
        where = {r: i for i, r in enumerate(self.bitmask_rows)}
        kept = [(j, where[r]) for j, r in enumerate(rows) if r in where]
        return SchedulerOutput(
            [self.seqs[r] for r in rows],
            sum(self.num_tokens[r] for r in rows if self.num_tokens[r] > 1 or not self.seqs[r].output_ids),
            self.num_kv_blocks,
            [self.num_tokens[r] for r in rows],
            None if self.banned is None else [self.banned[r] for r in rows],
            self.bitmask[[i for _, i in kept]] if self.bitmask is not None and kept else None,
            [j for j, _ in kept] if self.bitmask is not None and kept else [],
        )


class Scheduler:
    """Waiting requests queue in arrival order; running ones decode one token per step. Each step first
    gives every running sequence room for its next token, preempting the most recently admitted one when
    the pool is out of blocks (its blocks freed, back to the front of `waiting`, recomputed later). Then
    the step's token budget (`max_num_batched_tokens`) goes to the decodes first (one token each), then to
    waiting sequences admitted while sequence slots and free blocks allow, then to the next chunks of
    prompts admitted earlier, oldest first. A prompt longer than what is left is computed in chunks over
    the next steps (chunked prefill): a long prompt holds the running decodes back by at most one budget's
    worth of compute a step, and a short request that arrives meanwhile starts at the next step (vLLM v1
    serves running prefills before waiting requests; here a new arrival does not wait for a long prompt's
    last chunk). An admitted sequence holds blocks for all its tokens from its admission on.

    The pool starts empty and grows on demand (at least doubling) up to `max_num_blocks`."""

    def __init__(
        self,
        *,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_num_blocks: int,
        enable_prefix_caching: bool = True,
    ) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError(
                f"Scheduler: max_num_seqs and max_num_batched_tokens must be >= 1, "
                f"got {max_num_seqs}, {max_num_batched_tokens}"
            )
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.max_num_blocks = max_num_blocks
        self.block_manager = BlockManager(0, block_size, enable_prefix_caching=enable_prefix_caching)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last one is preempted first
        self.num_preemptions = 0
        self.num_prompt_tokens = 0  # prompts admitted (each counted once, at its first admission)
        self.prefix_cache_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_cache_hits = 0  # of those, tokens served from it

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out of whichever queue holds it and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.release(seq)

    def commit(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """After the forward pass: the step's `num_tokens` of `seq` (default: all) have their K/V in the
        cache; its newly full blocks join the prefix cache."""
        if num_tokens is None:
            seq.num_computed_tokens = len(seq.token_ids)
        else:
            seq.num_computed_tokens = min(seq.num_computed_tokens + num_tokens, len(seq.token_ids))
        self.block_manager.commit(seq)

    def reserve(self, seqs: list[Sequence]) -> None:
        """Size the pool once for the first wave of `seqs` (capped by max_num_blocks) instead of growing it
        step by step (LLM.generate knows all its requests up front)."""
        bm = self.block_manager
        need = sum(bm.blocks_for(s.max_len) for s in seqs[: self.max_num_seqs])
        want = min(max(need, max(bm.blocks_for(s.max_len) for s in seqs)), self.max_num_blocks)
        if want > bm.num_blocks:
            bm.grow(want)

    def _grow(self, want: int) -> bool:
        """Grow the pool by at least `want` blocks (at least doubling it, capped by max_num_blocks); False
        when it is already full size."""
        have = self.block_manager.num_blocks
        if have >= self.max_num_blocks:
            return False
        self.block_manager.grow(min(self.max_num_blocks, max(2 * have, have + want)))
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.release(seq)
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _admit(self, seq: Sequence, hit: PrefixHit, new_tokens: int) -> bool:
        """Allocate `seq`'s blocks with its prefix hit (looked up once, growing the pool if it is short)."""
        bm = self.block_manager
        if not bm.allocate_sequence(seq, hit) and not (
            self._grow(bm.blocks_for(new_tokens)) and bm.allocate_sequence(seq, hit)
        ):
            return False
        if seq.num_cached_tokens < 0:  # first admission (not a preempted one's return): count the prompt
            seq.num_cached_tokens = seq.num_computed_tokens
            self.num_prompt_tokens += seq.num_prompt
            self.prefix_cache_queries += seq.num_prompt
            self.prefix_cache_hits += seq.num_cached_tokens
        return True

    def schedule(self) -> SchedulerOutput:
        """The sequences of the next step and how many tokens each computes (`num_tokens`)."""
        bm = self.block_manager
        ready: list[Sequence] = []
        preempted = False
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            while not bm.append_slot(seq):
                if self._grow(1):
                    continue
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                ready.append(seq)
                i += 1
        budget = self.max_num_batched_tokens
        batch: list[Sequence] = []
        counts: list[int] = []

        def take(seq: Sequence) -> None:
            nonlocal budget
            n = min(seq.num_new_tokens, budget)
            batch.append(seq)
            counts.append(n)
            budget -= n

        for seq in ready:  # decodes first: one token each
            if budget and seq.num_new_tokens == 1:
                take(seq)
        while not preempted and budget and self.waiting and len(self.running) < self.max_num_seqs:
            # (after a preemption, admitting would only take the blocks the running ones are short of)
            seq = self.waiting[0]
            hit = bm.cached_prefix(seq.token_ids)  # once per admission, passed on to the allocation
            if seq.wants_prompt_logprobs and hit.num_tokens:  # every prompt position's logits are needed
                hit = PrefixHit([], [], 0)
            if not self._admit(seq, hit, len(seq.token_ids) - hit.num_tokens):
                break
            self.waiting.popleft()
            self.running.append(seq)
            take(seq)
        for seq in ready:  # then the next chunks of prompts admitted earlier, oldest first
            if budget and seq.num_new_tokens > 1:
                take(seq)
        if not batch and self.waiting:
            raise RuntimeError(
                f"the KV cache ({bm.num_blocks} blocks) cannot fit the next request "
                f"({bm.blocks_for(len(self.waiting[0].token_ids))} blocks)"
            )
        prompt = sum(n for s, n in zip(batch, counts, strict=True) if n > 1 or not s.output_ids)
        return SchedulerOutput(batch, prompt, bm.num_blocks, counts)
