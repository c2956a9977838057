"""`ModelRunner`: loads the model, owns the paged KV cache, turns sequences into batched forward passes."""

from __future__ import annotations

from pathlib import Path

import torch

from keel.engine.cpu_linear import can_pack, pack_linears
from keel.engine.kv_cache import BlockManager
from keel.engine.sequence import Sequence
from keel.hf.config import ModelConfig
from keel.hf.weights import iter_weights
from keel.models import get_model_class
from keel.models.llama import AttnContext, LlamaForCausalLM


def load_model(
    folder: Path, config: ModelConfig, dtype: torch.dtype, device: torch.device, progress: bool = True
) -> LlamaForCausalLM:
    """Build the model without initialising it (meta device), then fill it from the checkpoint."""
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

    def __init__(self, model: LlamaForCausalLM, block_size: int = 16, cpu_prepack: bool = True) -> None:
        self.model, self.config = model, model.config
        weight = model.model.embed_tokens.weight  # lm_head may already be packed (no .weight)
        self.device, self.dtype = weight.device, weight.dtype
        if cpu_prepack and can_pack(weight):
            pack_linears(model)  # policy lives here, not in the model (as gpt-fast applies torch.compile)
        self.block_size = block_size
        self.num_blocks = 0
        self.block_manager = BlockManager(1, block_size)

    def allocate_kv_cache(self, num_blocks: int, shuffle_seed: int | None = None) -> None:
        """(Re)allocate every layer's block pool [num_blocks, block_size, kv_heads, head_dim], zeroed."""
        cfg = self.config
        shape = (num_blocks, self.block_size, cfg.num_key_value_heads, cfg.head_dim)
        for layer in self.model.model.layers:
            attn = layer.self_attn
            attn.k_cache = attn.v_cache = None  # free the old pools first
            attn.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            attn.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.num_blocks = num_blocks
        self.block_manager = BlockManager(num_blocks, self.block_size, shuffle_seed)

    def kv_bytes_per_block(self) -> int:
        cfg = self.config
        elem = torch.empty(0, dtype=self.dtype).element_size()
        return 2 * cfg.num_hidden_layers * self.block_size * cfg.kv_size * elem

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _prepare_prefill(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor, AttnContext]:
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu = [0]
        bm = self.block_manager
        for seq in seqs:
            n = len(seq.token_ids)
            ids += seq.token_ids
            positions += range(n)
            slots += (bm.slot(seq.block_table, p) for p in range(n))
            cu.append(cu[-1] + n)
        ctx = AttnContext(is_prefill=True, slot_mapping=self._tensor(slots), cu_seqlens=cu)
        return self._tensor(ids), self._tensor(positions), ctx

    def _prepare_decode(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor, AttnContext]:
        bm = self.block_manager
        lens = [len(s.token_ids) for s in seqs]
        width = max(len(s.block_table) for s in seqs)
        tables = self._tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs])  # [B, W]
        ctx_lens = self._tensor(lens)[:, None]  # [B, 1]
        key_pos = torch.arange(width * self.block_size, device=self.device)[None, :]  # [1, L]
        mask = key_pos < ctx_lens
        if self.config.sliding_window is not None:
            mask &= key_pos > ctx_lens - 1 - self.config.sliding_window
        bias = torch.zeros(mask.shape, dtype=self.dtype, device=self.device).masked_fill_(~mask, float("-inf"))
        ctx = AttnContext(
            is_prefill=False,
            slot_mapping=self._tensor([bm.slot(s.block_table, n - 1) for s, n in zip(seqs, lens, strict=True)]),
            block_tables=tables,
            attn_bias=bias[:, None, None, :],
        )
        return self._tensor([s.token_ids[-1] for s in seqs]), self._tensor([n - 1 for n in lens]), ctx

    @torch.inference_mode()
    def step(self, seqs: list[Sequence], is_prefill: bool, all_logits: bool = False) -> torch.Tensor:
        """Forward one step; logits [B, V] of each sequence's last token ([T, V] with `all_logits`)."""
        prep = self._prepare_prefill if is_prefill else self._prepare_decode
        input_ids, positions, ctx = prep(seqs)
        hidden = self.model(input_ids, positions, ctx)  # [T, H]
        if is_prefill and not all_logits:
            assert ctx.cu_seqlens is not None
            hidden = hidden[self._tensor([c - 1 for c in ctx.cu_seqlens[1:]])]
        return self.model.compute_logits(hidden)
