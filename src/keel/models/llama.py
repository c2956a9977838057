"""Llama-family decoder (Llama, SmolLM2, Qwen2, Qwen3, Mistral) from keel's layers over a paged KV cache."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from keel import _compat, ops
from keel.hf.config import ModelConfig
from keel.hf.weights import WeightsError
from keel.layers.attention import AttnMetadata, PagedAttention, decode_attention_fn
from keel.layers.norm import RMSNorm
from keel.layers.rotary import RotaryEmbedding


class Attention(nn.Module):
    """GQA attention: fused qkv projection, rotary (shared by every layer), then the paged attention seam."""

    def __init__(self, cfg: ModelConfig, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.heads = [self.num_heads, self.num_kv_heads, self.num_kv_heads]  # qkv's split along its head dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.rotary_emb = rotary_emb
        self.attn = PagedAttention(window=cfg.sliding_window)  # holds this layer's K/V pools

    def forward(self, positions: torch.Tensor, x: torch.Tensor, ctx: AttnMetadata) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x).view(t, -1, self.head_dim)  # [T, H + 2 KV, D]
        # head-major views of the one projection: the ops below take strided [T, heads, D] rows (split_with_sizes:
        # Tensor.split is a Python wrapper that costs more, docs/measurements/2026-12-02-decode-overhead.md)
        q, k, v = qkv.split_with_sizes(self.heads, 1)
        if self.qk_norm:  # rms_norm returns contiguous copies: the rotary then rotates those
            q, k = self.q_norm(q), self.k_norm(k)
        self.rotary_emb(positions, q, k)  # in place
        out = self.attn(q, k, v, ctx)  # [T, H, D], contiguous
        return self.o_proj(out.view(t, self.q_size))


class MLP(nn.Module):
    """SwiGLU: fused gate/up projection, `silu_and_mul`, down projection."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    """Pre-norm block; the residual stream travels beside the hidden state (vLLM pattern)."""

    def __init__(self, cfg: ModelConfig, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, rotary_emb)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, ctx: AttnMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)  # embedding output is a fresh tensor
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, ctx)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary_emb = RotaryEmbedding(cfg.rope, cfg.head_dim, cfg.max_position_embeddings)
        self.layers = nn.ModuleList(DecoderLayer(cfg, self.rotary_emb) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.flat: Callable[[torch.Tensor, torch.Tensor, AttnMetadata], torch.Tensor] | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttnMetadata) -> torch.Tensor:
        if self.flat is not None:
            return self.flat(input_ids, positions, ctx)
        hidden = self.embed_tokens(input_ids)  # [T, H]
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, ctx)
        hidden, _ = self.norm(hidden, residual)
        return hidden


def projection_fn(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """A projection as a plain function of x: the layer's own `step_fn()` (keel's linear policies: its weight
    tensors captured, no attribute lookups per call), else the module itself (any other nn.Module, hooks and all)."""
    step_fn = getattr(module, "step_fn", None)
    return step_fn() if callable(step_fn) else module


def flat_forward(model: LlamaModel) -> Callable[[torch.Tensor, torch.Tensor, AttnMetadata], torch.Tensor]:
    """`model.forward` as one function over flat per-layer tuples: the same ops on the same tensors in the same
    order (the same bits: tests/models), without the ~11 nn.Module.__call__ and ~20 nn.Module.__getattr__ a layer
    costs per step (about 1 us each; docs/measurements/2026-12-02-decode-step.md). The ops are called through
    their C++ entries (keel._compat.op_entry); the projections through their layers' `step_fn`.

    What it captures is the model as it is now: weights (updated in place by load_weights, as they are), the
    projection layers and the attention layers (their K/V pools and the rotary table are read at every call,
    so growing the pools or rebuilding the table is seen). Swapping a submodule afterwards needs a new call,
    and hooks on the submodules are not run (the model runner builds it once, after its policies:
    `LlamaForCausalLM.flatten`)."""
    embedding = torch.nn.functional.embedding
    rms_norm = _compat.op_entry(torch.ops.keel.rms_norm.default)
    add_rms_norm = _compat.op_entry(torch.ops.keel.fused_add_rms_norm.default)
    rotary = _compat.op_entry(torch.ops.keel.rotary_embedding.default)
    silu_and_mul = _compat.op_entry(torch.ops.keel.silu_and_mul.default)
    embed_w, rope, final = model.embed_tokens.weight, model.rotary_emb, model.norm
    layers = []
    for layer in model.layers:
        a: Attention = layer.self_attn  # type: ignore[assignment]
        mlp: MLP = layer.mlp  # type: ignore[assignment]
        in_norm: RMSNorm = layer.input_layernorm  # type: ignore[assignment]
        post_norm: RMSNorm = layer.post_attention_layernorm  # type: ignore[assignment]
        qk = (a.q_norm.weight, a.q_norm.eps, a.k_norm.weight, a.k_norm.eps) if a.qk_norm else None
        layers.append(
            (
                (in_norm.weight, in_norm.eps),
                (post_norm.weight, post_norm.eps),
                projection_fn(a.qkv_proj),
                projection_fn(a.o_proj),
                projection_fn(mlp.gate_up_proj),
                projection_fn(mlp.down_proj),
                decode_attention_fn(a.attn),
                qk,
                a.head_dim,
                a.heads,
                a.q_size,
            )
        )
    norms = [norm for norm, *_ in layers[1:]] + [(final.weight, final.eps)]  # after layer i: layer i + 1's input

    def forward(input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttnMetadata) -> torch.Tensor:
        t = input_ids.shape[0]
        residual = embedding(input_ids, embed_w)  # [T, H]
        cos_sin = rope.cos_sin_cache
        hidden = rms_norm(residual, *layers[0][0]) if layers else residual
        for (_, post, qkv_proj, o_proj, gate_up, down, attend, qk, d, heads, q_size), after in zip(
            layers, norms, strict=True
        ):
            q, k, v = qkv_proj(hidden).view(t, -1, d).split_with_sizes(heads, 1)
            if qk is not None:
                q, k = rms_norm(q, qk[0], qk[1]), rms_norm(k, qk[2], qk[3])
            rotary(positions, q, k, d, cos_sin, True)
            hidden = o_proj(attend(q, k, v, ctx).view(t, q_size))
            add_rms_norm(hidden, residual, *post)
            hidden = down(silu_and_mul(gate_up(hidden)))
            add_rms_norm(hidden, residual, *after)
        return hidden

    return forward


# checkpoint projection -> (fused keel parameter, shard index); shards are stacked along dim 0
_PACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaForCausalLM(nn.Module):
    """Causal LM head over `LlamaModel`; `forward` returns hidden states, `compute_logits` the logits."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttnMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)  # [N, V]

    def flatten(self, enable: bool = True) -> None:
        """Run `forward` through `flat_forward` (built now, from the model as it is: call it again after swapping
        a submodule), or, with enable=False, through the submodules' own forwards again."""
        self.model.flat = flat_forward(self.model) if enable else None

    def init_rope(self) -> None:
        """Build the shared cos/sin table on the model's device and dtype (after loading)."""
        w = self.model.embed_tokens.weight
        self.model.rotary_emb.build(w.dtype, w.device)

    def _shard_sizes(self, fused: str) -> list[int]:
        cfg = self.config
        if fused == "qkv_proj":
            return [cfg.q_size, cfg.kv_size, cfg.kv_size]
        return [cfg.intermediate_size, cfg.intermediate_size]

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors in (casting dtype), fusing q/k/v and gate/up; check shapes and coverage."""
        params = dict(self.named_parameters(remove_duplicate=False))
        expected: set[tuple[str, int]] = set()
        for name in params:
            if self.config.tie_word_embeddings and name == "lm_head.weight":
                continue
            fused = next((f for f in ("qkv_proj", "gate_up_proj") if f"{f}." in name), None)
            shards = len(self._shard_sizes(fused)) if fused else 1
            expected.update((name, i) for i in range(shards))
        loaded: set[tuple[str, int]] = set()
        for ckpt_name, tensor in weights:
            if "rotary_emb.inv_freq" in ckpt_name or (
                self.config.tie_word_embeddings and ckpt_name == "lm_head.weight"
            ):
                continue
            name, shard, dest = ckpt_name, 0, None
            for proj, (fused, index) in _PACKED.items():
                if f".{proj}." in ckpt_name:
                    name, shard = ckpt_name.replace(f".{proj}.", f".{fused}."), index
                    sizes = self._shard_sizes(fused)
                    if name in params:
                        dest = params[name].narrow(0, sum(sizes[:index]), sizes[index])
                    break
            else:
                dest = params.get(name)
            if dest is None:
                raise WeightsError(f"checkpoint tensor {ckpt_name!r} has no place in {self.config.architecture}")
            if tuple(tensor.shape) != tuple(dest.shape):
                raise WeightsError(
                    f"checkpoint tensor {ckpt_name!r} has shape {tuple(tensor.shape)}; config.json "
                    f"implies {tuple(dest.shape)}"
                )
            dest.copy_(tensor)
            loaded.add((name, shard))
        missing = sorted(f"{n}[{s}]" if ("qkv_proj." in n or "gate_up_proj." in n) else n for n, s in expected - loaded)
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise WeightsError(f"checkpoint is missing {len(missing)} tensors: {shown}")
        self.init_rope()
