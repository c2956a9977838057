"""`Scheduler`: which sequences the next forward pass computes (continuous batching with preemption)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from keel.engine.block_manager import BlockManager
from keel.engine.sequence import Sequence

GrowPool = Callable[[int], bool]  # (blocks wanted) -> whether the pool grew


class Scheduler:
    """Waiting requests queue in arrival order; running ones decode one token per step. Each step first
    gives every running sequence room for its next token, preempting the most recently admitted one when
    the pool is out of blocks (its blocks freed, back to the front of `waiting`, recomputed later), then
    admits waiting sequences while sequence slots, the token budget and free blocks allow."""

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError(
                f"Scheduler: max_num_seqs and max_num_batched_tokens must be >= 1, "
                f"got {max_num_seqs}, {max_num_batched_tokens}"
            )
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last one is preempted first
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of whichever queue holds it (abort, finish)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence, bm: BlockManager) -> None:
        bm.release(seq)
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def schedule(self, bm: BlockManager, grow: GrowPool) -> list[Sequence]:
        """The sequences of the next step; each computes `seq.num_new_tokens` tokens."""
        batch: list[Sequence] = []
        preempted = False
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            while not bm.append_slot(seq):
                if grow(1):
                    continue
                victim = self.running.pop()
                self._preempt(victim, bm)
                preempted = True
                if victim is seq:
                    break
            else:
                batch.append(seq)
                i += 1
        if preempted:  # admitting now would only take the blocks the running ones are short of
            return batch
        budget = self.max_num_batched_tokens - len(batch)
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            cached, _ = bm.cached_prefix(seq.token_ids)
            new_tokens = len(seq.token_ids) - len(cached) * bm.block_size
            if batch and new_tokens > budget:
                break
            if not bm.allocate_sequence(seq) and not (grow(bm.blocks_for(new_tokens)) and bm.allocate_sequence(seq)):
                break
            self.waiting.popleft()
            self.running.append(seq)
            batch.append(seq)
            budget -= seq.num_new_tokens
        return batch
