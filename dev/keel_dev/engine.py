"""Engine helpers shared by tests and the pipeline's probe; they reach into the engine's parts explicitly."""

from __future__ import annotations

import torch


def engine_of(llm):
    """The `LLMEngine` of a `keel.LLM` (or the engine itself)."""
    return getattr(llm, "llm_engine", llm)


def keel_prompt_logits(llm, ids: list[int]) -> torch.Tensor:
    """All-position logits [L, V] of one prompt through keel's prefill path (the KV pool grows if needed;
    the blocks are freed afterwards)."""
    from keel.engine import SamplingParams
    from keel.engine.scheduler import SchedulerOutput
    from keel.engine.sequence import Sequence

    engine = engine_of(llm)
    bm = engine.scheduler.block_manager
    seq = Sequence(None, ids, SamplingParams(), max_len=len(ids) + 1)
    short = bm.blocks_for(seq.max_len) - bm.num_free
    if short > 0:
        bm.grow(bm.num_blocks + short)
    seq.block_table = bm.allocate(seq.max_len)
    try:
        batch = SchedulerOutput([seq], num_prompt_tokens=len(ids), num_kv_blocks=bm.num_blocks)
        return engine.runner.forward(batch, all_logits=True)
    finally:
        bm.free(seq.block_table)


def fresh_kv_pool(llm, num_blocks: int, shuffle_seed: int | None = None) -> None:
    """Replace the scheduler's block manager by an empty one of `num_blocks` (nothing cached; with
    `shuffle_seed`, free blocks handed out in a shuffled order, so block tables are anything but
    contiguous). The runner's K/V tensors follow at the next step. Only between requests."""
    from keel.engine.block_manager import BlockManager

    engine = engine_of(llm)
    sched = engine.scheduler
    assert not engine.has_unfinished_requests(), "fresh_kv_pool: the engine has requests in flight"
    old = sched.block_manager
    sched.block_manager = BlockManager(num_blocks, old.block_size, shuffle_seed, old.enable_prefix_caching)
