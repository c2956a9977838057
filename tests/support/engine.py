"""Engine helpers shared by test modules."""

from __future__ import annotations

import torch


def keel_prompt_logits(llm, ids: list[int]) -> torch.Tensor:
    """All-position logits [L, V] of one prompt through keel's prefill path (the KV pool grows if needed;
    the blocks are freed afterwards)."""
    from keel.engine import SamplingParams
    from keel.engine.sequence import Sequence

    runner = llm.runner
    if not runner.block_manager.can_allocate(len(ids) + 1):
        runner.allocate_kv_cache(runner.block_manager.blocks_for(len(ids) + 1))
    seq = Sequence(0, None, ids, SamplingParams(), max_len=len(ids) + 1)
    seq.block_table = runner.block_manager.allocate(seq.max_len)
    try:
        return runner.step([seq], is_prefill=True, all_logits=True)
    finally:
        runner.block_manager.free(seq.block_table)
