"""`ModelRunner`: turns a scheduler step into one varlen forward pass and samples the next tokens.

It owns the K/V tensors (device memory, bound into every `PagedAttention` layer) and follows the pool size
the scheduler's block manager decides; which block holds what is the scheduler's business. It also owns
how the model's projections run (keel's kernel, oneDNN prepacking or FP8): a policy applied to the loaded
model, as gpt-fast applies compilation in its runner, so the model code stays plain `nn.Linear`."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from keel.engine.block_manager import slot_mapping
from keel.engine.scheduler import SchedulerOutput
from keel.layers.attention import PAGE_MULTIPLE, AttnMetadata, PagedAttention
from keel.layers.fp8_linear import quantize_linears
from keel.layers.linear import can_pack, keel_linears, pack_linears
from keel.layers.sampler import RowLogprobs, SamplerOutput, prompt_logprobs, sample
from keel.models.llama import LlamaForCausalLM


@dataclass(slots=True)
class StepResult:
    """One step's sampled tokens (with logprobs where asked) and, for the sequences that asked for prompt
    logprobs in this prefill, theirs (batch row -> one entry per prompt token after the first)."""

    sampled: SamplerOutput
    prompt_logprobs: dict[int, list[RowLogprobs]]

    @property
    def token_ids(self) -> list[int]:
        return self.sampled.token_ids


class ModelRunner:
    """Runs prefill and decode steps for the scheduler's batches over a paged KV cache."""

    def __init__(
        self, model: LlamaForCausalLM, block_size: int = 16, *, cpu_prepack: bool = False, quantization: str = "none"
    ) -> None:
        self.model, self.config = model, model.config
        weight = model.model.embed_tokens.weight  # lm_head may be swapped below (no .weight then)
        self.device, self.dtype = weight.device, weight.dtype
        if quantization == "fp8":  # FP8 weights through the vendored fp8_gemm_nt (keel/layers/fp8_linear.py)
            quantize_linears(model)
        # else keel's kernel for every projection (the same tokens on every torch release); oneDNN
        # prepacking for prompts on request
        if cpu_prepack and can_pack(weight):
            pack_linears(model)
        keel_linears(model)  # whatever is still a plain nn.Linear
        self.block_size = block_size
        self.attention = [m for m in model.modules() if isinstance(m, PagedAttention)]
        self.num_kv_blocks = 0

    def kv_bytes_per_block(self) -> int:
        cfg = self.config
        elem = torch.empty(0, dtype=self.dtype).element_size()
        return 2 * cfg.num_hidden_layers * self.block_size * cfg.kv_size * elem

    def fit_kv_cache(self, num_blocks: int) -> None:
        """Give every layer's pools [num_blocks, block_size, kv_heads, head_dim]: grown with zeros, keeping
        every block's contents; a smaller pool means a fresh block manager (nothing cached), so fresh zeros."""
        if num_blocks == self.num_kv_blocks:
            return
        cfg = self.config
        have = self.num_kv_blocks if num_blocks > self.num_kv_blocks else 0
        extra = (num_blocks - have, self.block_size, cfg.num_key_value_heads, cfg.head_dim)
        for attn in self.attention:
            if not have:
                attn.k_cache = attn.v_cache = torch.empty(0)  # free the old pools first
            pad = torch.zeros(extra, dtype=self.dtype, device=self.device)
            attn.k_cache = torch.cat([attn.k_cache, pad]) if have else pad
            attn.v_cache = torch.cat([attn.v_cache, pad]) if have else pad.clone()
        self.num_kv_blocks = num_blocks

    def _tensor(self, values: list[int] | list[list[int]], dtype: torch.dtype = torch.long) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def prepare(self, batch: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, AttnMetadata]:
        """Pack every sequence's uncomputed tokens (prefill: the prompt past its cached prefix; decode: the
        last token) into one varlen batch: input ids, positions, attention metadata."""
        seqs, bs = batch.seqs, self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu = [0]
        for seq in seqs:
            start, end, table = seq.num_computed_tokens, len(seq.token_ids), seq.block_table
            if start >= end or len(table) * bs < end:
                raise RuntimeError(
                    f"ModelRunner: sequence {seq.request_id!r} has {end - start} tokens to compute "
                    f"and room for {len(table) * bs} in its {len(table)} blocks; expected >= 1 and room for {end}"
                )
            ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += slot_mapping(table, bs, start, end)
            cu.append(cu[-1] + end - start)
        width = max(len(s.block_table) for s in seqs)
        lens_k = [len(s.token_ids) for s in seqs]
        # Two host-to-tensor copies per step, not seven: the int64 inputs and the int32 metadata are each
        # one tensor, and the step's tensors are contiguous views of them (the kernels read 1-D slices).
        t = len(ids)
        longs = self._tensor([*ids, *positions, *slots])
        ints = self._tensor(
            [
                *cu,
                *lens_k,
                0,
                *itertools.accumulate(lens_k),
                *(b for s in seqs for b in (*s.block_table, *[0] * (width - len(s.block_table)))),
            ],
            torch.int32,
        )
        n = len(seqs)
        ctx = AttnMetadata(
            slot_mapping=longs[2 * t :],
            cu_seqlens_q=ints[: n + 1],
            seqused_k=ints[n + 1 : 2 * n + 1],
            cu_seqlens_k=ints[2 * n + 1 : 3 * n + 2],
            block_tables=ints[3 * n + 2 :].view(n, width),
            max_seqlen_q=max(b - a for a, b in zip(cu[:-1], cu[1:], strict=True)),
            max_seqlen_k=max(lens_k),
        )
        if bs % PAGE_MULTIPLE:
            ctx.context_slots = self._tensor(
                [p for s in seqs for p in slot_mapping(s.block_table, bs, 0, len(s.token_ids))]
            )
        return longs[:t], longs[t : 2 * t], ctx

    @torch.inference_mode()
    def forward(
        self, batch: SchedulerOutput, all_logits: bool = False, prompt_rows: list[int] | None = None
    ) -> torch.Tensor:
        """Forward each sequence's uncomputed tokens in one pass; logits [B, V] of each sequence's last token
        ([T, V] of every computed token with `all_logits`). With `prompt_rows`, the logits of every computed
        token of those sequences follow the B last-token rows, in that order ([B + sum of their tokens, V])."""
        self.fit_kv_cache(batch.num_kv_blocks)  # a no-op unless the scheduler's pool changed size
        input_ids, positions, ctx = self.prepare(batch)
        hidden = self.model(input_ids, positions, ctx)  # [T, H]
        if not all_logits and (prompt_rows or hidden.shape[0] != ctx.num_seqs):  # (decode: every row is a last)
            picked = [(ctx.cu_seqlens_q[1:] - 1).long()]
            for r in prompt_rows or ():
                picked.append(torch.arange(int(ctx.cu_seqlens_q[r]), int(ctx.cu_seqlens_q[r + 1]), device=self.device))
            hidden = hidden[torch.cat(picked)]
        return self.model.compute_logits(hidden)

    def run(self, batch: SchedulerOutput) -> StepResult:
        """One step: the forward pass, then each sequence's next token (with what the engine put in `batch`
        for the sampler); prompt logprobs for the sequences in prefill that ask for them."""
        seqs = batch.seqs
        prompt_rows = [r for r, s in enumerate(seqs) if s.wants_prompt_logprobs and s.num_computed_tokens == 0]
        logits = self.forward(batch, prompt_rows=prompt_rows)
        last = logits[: len(seqs)]
        sampled = sample(
            last,
            [s.params for s in seqs],
            [s.generator for s in seqs],
            [s.token_ids for s in seqs],
            num_prompt=[s.num_prompt for s in seqs],
            banned=batch.banned,
            bitmask=batch.bitmask,
            bitmask_rows=batch.bitmask_rows,
            logprob_rows=[r for r, s in enumerate(seqs) if s.tracks_logprob],
        )
        prompt: dict[int, list[RowLogprobs]] = {}
        at = len(seqs)
        for r in prompt_rows:
            seq = seqs[r]
            n = len(seq.token_ids) - seq.num_computed_tokens
            k = seq.params.prompt_logprobs or 0
            prompt[r] = prompt_logprobs(logits[at : at + n - 1], seq.prompt_token_ids, k)
            at += n
        return StepResult(sampled, prompt)
