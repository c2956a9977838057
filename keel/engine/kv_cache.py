"""Paged KV cache bookkeeping: a pool of fixed-size blocks and per-sequence block tables."""

from __future__ import annotations

import random
from collections import deque


class CacheFullError(RuntimeError):
    """A request needs more KV-cache blocks than the whole pool holds."""


class BlockManager:
    """Hands out cache blocks; a sequence reserves all blocks it can ever need when it is admitted."""

    def __init__(self, num_blocks: int, block_size: int, shuffle_seed: int | None = None) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"BlockManager: num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        ids = list(range(num_blocks))
        if shuffle_seed is not None:  # tests: block tables that are anything but contiguous
            random.Random(shuffle_seed).shuffle(ids)
        self._free: deque[int] = deque(ids)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) <= len(self._free)

    def allocate(self, num_tokens: int) -> list[int]:
        """A block table with room for `num_tokens` tokens."""
        need = self.blocks_for(num_tokens)
        if need > self.num_blocks:
            raise CacheFullError(
                f"a sequence of {num_tokens} tokens needs {need} blocks of {self.block_size}; "
                f"the KV cache has only {self.num_blocks}"
            )
        if need > len(self._free):
            raise CacheFullError(f"need {need} free blocks, have {len(self._free)}")
        return [self._free.popleft() for _ in range(need)]

    def free(self, block_table: list[int]) -> None:
        self._free.extend(block_table)
        block_table.clear()

    def slot(self, block_table: list[int], position: int) -> int:
        """Flat cache slot (block * block_size + offset) of token `position`."""
        return block_table[position // self.block_size] * self.block_size + position % self.block_size
