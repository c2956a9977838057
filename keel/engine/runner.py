"""`ModelRunner`: loads the model, owns the paged KV cache and its block manager, turns a batch of sequences
into one varlen forward pass."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch

from keel.engine.attention import PAGE_MULTIPLE, AttnMetadata
from keel.engine.block_manager import BlockManager
from keel.engine.cpu_linear import can_pack, keel_linears, pack_linears
from keel.engine.sequence import Sequence
from keel.hf.config import ModelConfig
from keel.hf.weights import iter_weights, validate_checkpoint
from keel.models import get_model_class
from keel.models.llama import LlamaForCausalLM


def load_model(
    folder: Path, config: ModelConfig, dtype: torch.dtype, device: torch.device, progress: bool = True
) -> LlamaForCausalLM:
    """Build the model without initialising it (meta device), then fill it from the checkpoint."""
    validate_checkpoint(folder, config)  # headers only: every tensor present, with its shape, before allocating
    cls = get_model_class(config.architecture)
    with torch.device("meta"):
        model = cls(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    if config.tie_word_embeddings:  # to_empty() breaks the tie; restore it
        model.lm_head.weight = model.model.embed_tokens.weight
    model.load_weights(iter_weights(folder, progress=progress))
    return model.eval().requires_grad_(False)


class ModelRunner:
    """Runs prefill and decode steps for a batch of sequences over a paged KV cache."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        block_size: int = 16,
        cpu_prepack: bool = False,
        enable_prefix_caching: bool = True,
    ) -> None:
        self.model, self.config = model, model.config
        weight = model.model.embed_tokens.weight  # lm_head may already be packed (no .weight)
        self.device, self.dtype = weight.device, weight.dtype
        # policy lives here, not in the model (as gpt-fast applies torch.compile): keel's kernel for every
        # projection by default (the same tokens on every torch release); oneDNN prepacking on request
        if cpu_prepack and can_pack(weight):
            pack_linears(model)
        keel_linears(model)  # whatever is still a plain nn.Linear
        self.block_size, self.enable_prefix_caching = block_size, enable_prefix_caching
        self.num_blocks = 0
        self.block_manager = BlockManager(0, block_size, enable_prefix_caching=enable_prefix_caching)

    def allocate_kv_cache(self, num_blocks: int, shuffle_seed: int | None = None) -> None:
        """(Re)allocate every layer's block pool [num_blocks, block_size, kv_heads, head_dim], zeroed, with a
        fresh block manager (any cached prefix is forgotten)."""
        cfg = self.config
        shape = (num_blocks, self.block_size, cfg.num_key_value_heads, cfg.head_dim)
        for attn in self.model.attention_layers():
            attn.k_cache = attn.v_cache = torch.empty(0)  # free the old pools first
            attn.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            attn.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.num_blocks = num_blocks
        self.block_manager = BlockManager(num_blocks, self.block_size, shuffle_seed, self.enable_prefix_caching)

    def grow_kv_cache(self, num_blocks: int) -> None:
        """Enlarge the pools to `num_blocks`, keeping every block's contents, table and cached identity
        (the block manager object stays the same: the scheduler may hold it)."""
        if num_blocks <= self.num_blocks:
            return
        cfg = self.config
        extra = (num_blocks - self.num_blocks, self.block_size, cfg.num_key_value_heads, cfg.head_dim)
        for attn in self.model.attention_layers():
            pad = torch.zeros(extra, dtype=self.dtype, device=self.device)
            attn.k_cache = torch.cat([attn.k_cache, pad]) if self.num_blocks else pad
            attn.v_cache = torch.cat([attn.v_cache, pad]) if self.num_blocks else pad.clone()
        self.num_blocks = num_blocks
        self.block_manager.grow(num_blocks)

    def kv_bytes_per_block(self) -> int:
        cfg = self.config
        elem = torch.empty(0, dtype=self.dtype).element_size()
        return 2 * cfg.num_hidden_layers * self.block_size * cfg.kv_size * elem

    def _tensor(self, values: list[int] | list[list[int]], dtype: torch.dtype = torch.long) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def prepare(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor, AttnMetadata]:
        """Pack every sequence's uncomputed tokens (prefill: the prompt past its cached prefix; decode: the
        last token) into one varlen batch: input ids, positions, attention metadata."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu = [0]
        bs = self.block_size
        for seq in seqs:
            start, end, table = seq.num_computed_tokens, len(seq.token_ids), seq.block_table
            if start >= end or len(table) * bs < end:
                raise RuntimeError(
                    f"ModelRunner: sequence {seq.request_id or seq.index} has {end - start} tokens to compute "
                    f"and room for {len(table) * bs} in its {len(table)} blocks; expected >= 1 and room for {end}"
                )
            ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += (table[p // bs] * bs + p % bs for p in range(start, end))
            cu.append(cu[-1] + end - start)
        width = max(len(s.block_table) for s in seqs)
        lens_k = [len(s.token_ids) for s in seqs]
        ctx = AttnMetadata(
            slot_mapping=self._tensor(slots),
            cu_seqlens_q=self._tensor(cu, torch.int32),
            seqused_k=self._tensor(lens_k, torch.int32),
            cu_seqlens_k=self._tensor([0, *itertools.accumulate(lens_k)], torch.int32),
            block_tables=self._tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs], torch.int32),
            max_seqlen_q=max(b - a for a, b in zip(cu[:-1], cu[1:], strict=True)),
            max_seqlen_k=max(lens_k),
        )
        if bs % PAGE_MULTIPLE:
            ctx.context_slots = self._tensor(
                [s.block_table[p // bs] * bs + p % bs for s in seqs for p in range(len(s.token_ids))]
            )
        return self._tensor(ids), self._tensor(positions), ctx

    @torch.inference_mode()
    def step(self, seqs: list[Sequence], is_prefill: bool | None = None, all_logits: bool = False) -> torch.Tensor:
        """Forward each sequence's uncomputed tokens in one pass; logits [B, V] of each sequence's last token
        ([T, V] of every computed token with `all_logits`). `is_prefill=False` asserts a pure decode step."""
        input_ids, positions, ctx = self.prepare(seqs)
        if is_prefill is False and not ctx.is_decode:
            raise RuntimeError("ModelRunner.step: is_prefill=False but a sequence has more than one new token")
        hidden = self.model(input_ids, positions, ctx)  # [T, H]
        if not all_logits:
            hidden = hidden[(ctx.cu_seqlens_q[1:] - 1).long()]
        return self.model.compute_logits(hidden)
