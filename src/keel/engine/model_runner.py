"""`ModelRunner`: turns a scheduler step into one varlen forward pass and samples the next tokens.

It owns the K/V tensors (device memory, bound into every `PagedAttention` layer) and follows the pool size
the scheduler's block manager decides; which block holds what is the scheduler's business. It also owns
how the model's projections run (keel's kernel, oneDNN prepacking or FP8): a policy applied to the loaded
model, as gpt-fast applies compilation in its runner, so the model code stays plain `nn.Linear`."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

import torch

from keel.engine import host_memory
from keel.engine.block_manager import slot_mapping
from keel.engine.scheduler import SchedulerOutput, StepCost
from keel.layers.attention import PAGE_MULTIPLE, AttnMetadata, PagedAttention
from keel.layers.fp8_linear import quantize_linears
from keel.layers.linear import can_pack, keel_linears, pack_linears
from keel.layers.sampler import RowLogprobs, prompt_logprobs, sample
from keel.models.llama import LlamaForCausalLM

log = logging.getLogger("keel.engine")


@dataclass(slots=True)
class StepResult:
    """One step's result per batch row: the next token (None: the row's prompt chunk does not reach its
    end, it is a scoring request, or it failed), its logprobs where asked, the prompt logprobs this
    step's chunk gives (batch row -> one entry per prompt token it predicts, for the sequences that ask
    for them), and the rows that failed alone (row -> why)."""

    token_ids: list[int | None]
    logprobs: list[RowLogprobs | None]
    prompt_logprobs: dict[int, list[RowLogprobs]] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)

    @staticmethod
    def merge(parts: list[StepResult]) -> StepResult:
        """The results of one-row batches, in row order, as one."""
        out = StepResult([], [])
        for r, part in enumerate(parts):
            out.token_ids += part.token_ids
            out.logprobs += part.logprobs
            if 0 in part.prompt_logprobs:
                out.prompt_logprobs[r] = part.prompt_logprobs[0]
            if 0 in part.errors:
                out.errors[r] = part.errors[0]
        return out


# Attention's FLOP rate against the projections' on a CPU (keel's attention kernel against its GEMMs), fitted from
# step times against chunk position by benchmarks/step_cost.py: docs/measurements/2026-12-07-hostile-probe.md.
# Elsewhere (CUDA) not measured: FLOPs alone.
CPU_ATTENTION_SPEED = 1 / 3


def step_cost(config: object, device_type: str = "cpu") -> StepCost:
    """What a token costs the scheduler's step budget for a Llama-family model: per token, its projections
    take 2 FLOPs a weight and its attention 4 x layers x heads x head_dim FLOPs per attended position; their
    ratio, times attention's relative speed on `device_type`, is the break-even context. Tokens only when a
    number is missing or not a positive int."""
    names = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    values = [getattr(config, name, None) for name in names]
    ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    if len(ints) < len(names):
        return StepCost()
    hidden, inter, heads, kv_heads, head_dim = ints
    window = getattr(config, "sliding_window", None)
    weights = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * inter  # a layer's
    speed = CPU_ATTENTION_SPEED if device_type == "cpu" else 1.0
    flops = weights / (2 * heads * head_dim)
    return StepCost(flops * speed, window if isinstance(window, int) and window > 0 else None)


class ModelRunner:
    """Runs prefill and decode steps for the scheduler's batches over a paged KV cache."""

    def __init__(
        self, model: LlamaForCausalLM, block_size: int = 16, *, cpu_prepack: bool = False, quantization: str = "none"
    ) -> None:
        self.model, self.config = model, model.config
        weight = model.model.embed_tokens.weight  # lm_head may be swapped below (no .weight then)
        self.device, self.dtype = weight.device, weight.dtype
        if quantization == "fp8":  # FP8 weights through the vendored fp8_gemm_nt (src/keel/layers/fp8_linear.py)
            quantize_linears(model)
        # else keel's kernel for every projection (the same tokens on every torch release); oneDNN
        # prepacking for prompts on request
        if cpu_prepack and can_pack(weight):
            pack_linears(model)
        keel_linears(model)  # whatever is still a plain nn.Linear
        host_memory.rehome([*model.parameters(), *model.buffers()])  # CPU weights as they now are, on huge pages
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
        shape = (num_blocks, self.block_size, cfg.num_key_value_heads, cfg.head_dim)
        if not have:
            for attn in self.attention:  # free the old pools first
                attn.k_cache = attn.v_cache = torch.empty(0)
        pools = host_memory.zeros(2 * len(self.attention), shape, self.dtype, self.device)  # CPU: on huge pages
        for attn, k, v in zip(self.attention, pools[0::2], pools[1::2], strict=True):
            if have:
                k[:have].copy_(attn.k_cache)
                v[:have].copy_(attn.v_cache)
            attn.k_cache, attn.v_cache = k, v
        self.num_kv_blocks = num_blocks

    def _tensor(self, values: list[int] | list[list[int]], dtype: torch.dtype = torch.long) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def prepare(self, batch: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, AttnMetadata]:
        """Pack every sequence's tokens of this step (prefill: a chunk of the prompt past its cached prefix
        and its earlier chunks; decode: the last token) into one varlen batch: input ids, positions,
        attention metadata."""
        seqs, bs = batch.seqs, self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu = [0]
        for seq, n in zip(seqs, batch.num_tokens, strict=True):
            start, table = seq.num_computed_tokens, seq.block_table
            end = start + n
            if start >= end or end > len(seq.token_ids) or len(table) * bs < end:
                raise RuntimeError(
                    f"ModelRunner: sequence {seq.request_id!r} has {end - start} tokens to compute "
                    f"and room for {len(table) * bs} in its {len(table)} blocks; expected >= 1 and room for {end}"
                )
            ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += slot_mapping(table, bs, start, end)
            cu.append(cu[-1] + end - start)
        width = max(len(s.block_table) for s in seqs)
        lens_k = [s.num_computed_tokens + n for s, n in zip(seqs, batch.num_tokens, strict=True)]
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
                [p for s, k in zip(seqs, lens_k, strict=True) for p in slot_mapping(s.block_table, bs, 0, k)]
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
        """One step: the forward pass, then the next token of each sequence whose chunk completes it (with
        what the engine put in `batch` for the sampler); prompt logprobs for the sequences in prefill that
        ask for them. A failure fails only its rows: a sampler row that cannot be sampled is an error of
        that row; when the forward pass itself raises, the batch is run again row by row and the rows that
        fail alone are the errors (nothing was sampled before the forward pass, so the others sample as
        they would have)."""
        try:
            return self._run(batch)
        except Exception as exc:  # noqa: BLE001 - which rows caused it is found below
            if len(batch.seqs) == 1:
                log.warning("step failed for request %r", batch.seqs[0].request_id, exc_info=True)
                return StepResult([None], [None], {}, {0: f"the engine failed on this request: {exc}"})
            log.warning("step of %d sequences failed; retrying row by row", len(batch.seqs), exc_info=True)
            return StepResult.merge([self.run(batch.subset([r])) for r in range(len(batch.seqs))])

    def _run(self, batch: SchedulerOutput) -> StepResult:
        seqs, counts = batch.seqs, batch.num_tokens
        prompt_rows = [
            r
            for r, s in enumerate(seqs)
            if s.wants_prompt_logprobs and s.num_computed_tokens < s.num_prompt - 1 and counts[r]
        ]
        logits = self.forward(batch, prompt_rows=prompt_rows)
        result = StepResult([None] * len(seqs), [None] * len(seqs))
        rows = batch.sample_rows
        if rows:
            last = logits[: len(seqs)] if len(rows) == len(seqs) else logits[torch.tensor(rows, device=self.device)]
            where = {r: j for j, r in enumerate(rows)}
            mask_rows = [where[r] for r in batch.bitmask_rows]  # the engine asks bitmasks of sampled rows only
            sampled = sample(
                last,
                [seqs[r].params for r in rows],
                [seqs[r].generator for r in rows],
                [seqs[r].token_ids for r in rows],
                num_prompt=[seqs[r].num_prompt for r in rows],
                banned=None if batch.banned is None else [batch.banned[r] for r in rows],
                bitmask=batch.bitmask,
                bitmask_rows=mask_rows,
                logprob_rows=[j for j, r in enumerate(rows) if seqs[r].tracks_logprob],
            )
            for j, r in enumerate(rows):
                if j in sampled.errors:
                    result.errors[r] = sampled.errors[j]
                else:
                    result.token_ids[r], result.logprobs[r] = sampled.token_ids[j], sampled.logprobs[j]
        at = len(seqs)
        for r in prompt_rows:
            seq, n = seqs[r], counts[r]
            start = seq.num_computed_tokens
            m = min(start + n, seq.num_prompt - 1) - start  # positions whose next token is a prompt token
            k = seq.params.prompt_logprobs or 0
            result.prompt_logprobs[r] = prompt_logprobs(
                logits[at : at + m], seq.prompt_token_ids[start + 1 : start + 1 + m], k
            )
            at += n
        return result
