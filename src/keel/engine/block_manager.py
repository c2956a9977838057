"""Paged KV-cache bookkeeping: a pool of fixed-size blocks, per-sequence block tables that grow with the
sequence, and prefix caching of full blocks (chained token hashes, reference counts, LRU eviction).

The scheduler owns the one `BlockManager` (as nano-vllm's Scheduler owns its BlockManager and vLLM's its
KVCacheManager); the model runner owns the K/V tensors those block ids index and maps token positions to
cache slots with `slot_mapping`, the one place that does."""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass

from keel.engine.sequence import Sequence


class CacheFullError(RuntimeError):
    """A request needs more KV-cache blocks than the whole pool holds."""


@dataclass(slots=True)
class Block:
    """One cache block; `hash`/`token_ids` are set once it is full and computed (then it can be shared)."""

    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()


@dataclass(slots=True, frozen=True)
class PrefixHit:
    """The cached full blocks a prompt starts with: their ids, chained hashes and the tokens they hold."""

    block_ids: list[int]
    hashes: list[int]
    num_tokens: int


def slot_mapping(block_table: list[int], block_size: int, start: int, end: int) -> list[int]:
    """Flat cache slots (block * block_size + offset) of token positions [start, end) of one sequence."""
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]


def block_hash(prefix_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Identity of a full block: its tokens and everything before it (through the previous block's hash).
    Python's tuple-of-int hash does not depend on PYTHONHASHSEED; hits are also checked token by token."""
    return hash((prefix_hash, token_ids))


class BlockManager:
    """Hands out blocks as sequences grow. Blocks nobody references sit in `_free` in LRU order (oldest
    first); a free block that still holds a cached prefix is reused by a hit or evicted when it is taken."""

    def __init__(
        self, num_blocks: int, block_size: int, shuffle_seed: int | None = None, enable_prefix_caching: bool = True
    ) -> None:
        if num_blocks < 0 or block_size < 1:
            raise ValueError(
                f"BlockManager: num_blocks must be >= 0 and block_size >= 1, got {num_blocks}, {block_size}"
            )
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        ids = list(range(num_blocks))
        if shuffle_seed is not None:  # a test hook: block tables that are anything but contiguous
            random.Random(shuffle_seed).shuffle(ids)
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(ids)
        self._by_hash: dict[int, int] = {}  # block hash -> block id holding those tokens

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) <= len(self._free)

    def grow(self, num_blocks: int) -> None:
        """Extend the pool to `num_blocks` (the runner grows its cache tensors to match before the next step);
        new blocks are used first."""
        for i in range(self.num_blocks, num_blocks):
            self.blocks.append(Block(i))
            self._free[i] = None
            self._free.move_to_end(i, last=False)
        self.num_blocks = max(self.num_blocks, num_blocks)

    def _take_fresh(self) -> int:
        """The least recently freed block, its cached identity (if any) evicted."""
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None and self._by_hash.get(block.hash) == block_id:
            del self._by_hash[block.hash]
        block.hash, block.token_ids, block.ref_count = None, (), 1
        return block_id

    def allocate(self, num_tokens: int) -> list[int]:
        """A block table of fresh blocks with room for `num_tokens` tokens."""
        need = self.blocks_for(num_tokens)
        if need > self.num_blocks:
            raise CacheFullError(
                f"a sequence of {num_tokens} tokens needs {need} blocks of {self.block_size}; "
                f"the KV cache has only {self.num_blocks}"
            )
        if need > len(self._free):
            raise CacheFullError(f"need {need} free blocks, have {len(self._free)}")
        return [self._take_fresh() for _ in range(need)]

    def free(self, block_table: list[int]) -> None:
        """Drop one reference to each block, tail first, so a prefix outlives its tails in the LRU order."""
        for block_id in reversed(block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
        block_table.clear()

    def cached_prefix(self, token_ids: list[int]) -> PrefixHit:
        """The longest chain of cached full blocks that starts `token_ids`. It stops one token short of the
        end: the last token is always computed (its logits give the next token)."""
        ids: list[int] = []
        hashes: list[int] = []
        if not self.enable_prefix_caching:
            return PrefixHit(ids, hashes, 0)
        h = None
        bs = self.block_size
        for i in range((len(token_ids) - 1) // bs):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            h = block_hash(h, tokens)
            block_id = self._by_hash.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            ids.append(block_id)
            hashes.append(h)
        return PrefixHit(ids, hashes, len(ids) * bs)

    def blocks_to_admit(self, seq: Sequence, hit: PrefixHit) -> int:
        """Free blocks that admitting `seq` with `hit` takes: fresh ones plus cached hits nobody holds."""
        fresh = self.blocks_for(len(seq.token_ids)) - len(hit.block_ids)
        return fresh + sum(1 for b in hit.block_ids if self.blocks[b].ref_count == 0)

    def allocate_sequence(self, seq: Sequence, hit: PrefixHit) -> bool:
        """Give a waiting sequence blocks for all its tokens, sharing the cached prefix `hit` (from
        `cached_prefix(seq.token_ids)`, with no allocation since); False if too few blocks are free.
        Sets `seq.num_computed_tokens` to the tokens served from the cache."""
        assert not seq.block_table, "allocate_sequence: the sequence already holds blocks"
        if self.blocks_to_admit(seq, hit) > len(self._free):
            return False
        for block_id in hit.block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
        fresh = self.blocks_for(len(seq.token_ids)) - len(hit.block_ids)
        seq.block_table = hit.block_ids + [self._take_fresh() for _ in range(fresh)]
        seq.block_hashes = list(hit.hashes)
        seq.num_computed_tokens = hit.num_tokens
        return True

    def append_slot(self, seq: Sequence) -> bool:
        """Make room for every token of a running sequence (one block more at a block boundary)."""
        if len(seq.block_table) * self.block_size >= len(seq.token_ids):
            return True
        if not self._free:
            return False
        seq.block_table.append(self._take_fresh())
        return True

    def commit(self, seq: Sequence) -> None:
        """After a step: publish the sequence's newly full, computed blocks to the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(len(seq.block_hashes), seq.num_computed_tokens // bs):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = block_hash(seq.block_hashes[-1] if seq.block_hashes else None, tokens)
            block = self.blocks[seq.block_table[i]]
            block.hash, block.token_ids = h, tokens
            self._by_hash.setdefault(h, block.block_id)  # a twin computed in the same step stays private
            seq.block_hashes.append(h)

    def release(self, seq: Sequence) -> None:
        """Free a finished, aborted or preempted sequence's blocks; cached ones stay findable until evicted."""
        self.free(seq.block_table)
        seq.block_hashes = []
        seq.num_computed_tokens = 0
