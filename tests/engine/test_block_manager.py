"""Block manager: growth block by block, prefix hits shared and reference-counted, chained hashes, LRU
eviction of cached blocks, the one slot mapping."""

from __future__ import annotations

from keel.engine import SamplingParams
from keel.engine.block_manager import BlockManager, slot_mapping
from keel.engine.sequence import Sequence


def seq_of(tokens: list[int]) -> Sequence:
    return Sequence(None, tokens, SamplingParams(), max_len=len(tokens) + 8)


def admit(bm: BlockManager, seq: Sequence) -> bool:
    """What the scheduler does at admission: look the prefix up once, allocate with that hit."""
    return bm.allocate_sequence(seq, bm.cached_prefix(seq.token_ids))


def computed(bm: BlockManager, seq: Sequence) -> Sequence:
    """What the engine does after a forward pass: every token computed, full blocks published."""
    seq.num_computed_tokens = len(seq.token_ids)
    bm.commit(seq)
    return seq


def test_blocks_grow_with_the_sequence():
    bm = BlockManager(4, 4)
    seq = seq_of([1, 2, 3])
    assert admit(bm, seq) and len(seq.block_table) == 1  # the prompt only, not max_tokens
    for t in range(4, 14):
        seq.token_ids.append(t)
        assert bm.append_slot(seq)
        assert len(seq.block_table) == -(-len(seq.token_ids) // 4)
    seq.token_ids += [0, 0, 0]  # 16 tokens: still 4 blocks
    assert bm.append_slot(seq) and bm.num_free == 0
    seq.token_ids.append(0)
    assert not bm.append_slot(seq)  # the pool is out of blocks


def test_prefix_hit_is_shared_and_reference_counted():
    bm = BlockManager(8, 4)
    a = seq_of(list(range(10)))
    assert admit(bm, a) and a.num_computed_tokens == 0
    computed(bm, a)
    b = seq_of(list(range(8)) + [50, 51])
    assert admit(bm, b)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert b.num_computed_tokens == 8 and bm.blocks[a.block_table[0]].ref_count == 2
    used = bm.num_used
    bm.release(a)
    assert bm.num_used == used - 1  # only a's private tail block is free
    bm.release(b)
    assert bm.num_used == 0


def test_whole_prompt_cached_still_computes_its_last_token():
    bm = BlockManager(8, 4)
    a = seq_of(list(range(8)))
    admit(bm, a)
    computed(bm, a)
    table = list(a.block_table)
    bm.release(a)
    b = seq_of(list(range(8)))
    assert admit(bm, b)
    assert b.num_computed_tokens == 4 and b.num_new_tokens == 4  # the last block is recomputed, not shared
    assert b.block_table[0] == table[0] and b.block_table[1] != table[1]


def test_hash_chain_depends_on_the_prefix():
    bm = BlockManager(8, 4)
    a = seq_of([1, 2, 3, 4, 5, 6, 7, 8, 9])
    admit(bm, a)
    computed(bm, a)
    hit = bm.cached_prefix([9, 9, 9, 9, 5, 6, 7, 8, 9])  # same second block, other first block
    assert hit.block_ids == [] and hit.num_tokens == 0
    hit = bm.cached_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0])
    assert hit.block_ids == a.block_table[:2] and hit.num_tokens == 8


def test_lru_eviction_takes_the_tail_of_the_oldest_prefix_first():
    bm = BlockManager(4, 4)
    a = seq_of(list(range(9)))  # 2 full blocks + 1
    admit(bm, a)
    computed(bm, a)
    table = list(a.block_table)
    bm.release(a)
    assert bm.cached_prefix(list(range(9))).block_ids == table[:2]  # freed but still cached
    grab = bm.allocate(8)  # two blocks: the never-used one, then a's partial tail
    assert table[2] in grab and bm.cached_prefix(list(range(9))).block_ids == table[:2]
    grab += bm.allocate(4)  # one more block: evicts a's second block (freed before its first)
    assert table[1] in grab and bm.cached_prefix(list(range(9))).block_ids == table[:1]
    bm.free(grab)


def test_prefix_caching_off_never_hits():
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    a = seq_of(list(range(9)))
    admit(bm, a)
    computed(bm, a)
    bm.release(a)
    b = seq_of(list(range(9)))
    admit(bm, b)
    assert b.num_computed_tokens == 0 and bm.cached_prefix(list(range(9))).block_ids == []


def test_slot_mapping_follows_the_block_table():
    table = [5, 2, 7]
    assert slot_mapping(table, 4, 2, 9) == [22, 23, 8, 9, 10, 11, 28]  # block 5 rows 2-3, block 2, block 7 row 0
    assert slot_mapping(table, 4, 3, 3) == []
