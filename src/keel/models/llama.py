"""Llama-family decoder (Llama, SmolLM2, Qwen2, Qwen3, Mistral) from keel's layers over a paged KV cache."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from keel import ops
from keel.hf.config import ModelConfig
from keel.hf.weights import WeightsError
from keel.layers import generation
from keel.layers.attention import AttnMetadata, PagedAttention
from keel.layers.linear import projection
from keel.layers.norm import RMSNorm
from keel.layers.rotary import RotaryEmbedding
from keel.ops.layer import Projection


class Attention(nn.Module):
    """GQA attention's parts: the fused qkv projection, q/k norms (Qwen3), the shared rotary table, the paged
    attention seam (this layer's K/V pools) and the o projection. The step runs in DecoderLayer.forward."""

    def __init__(self, cfg: ModelConfig, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.rotary_emb = rotary_emb
        self.attn = PagedAttention(window=cfg.sliding_window)  # holds this layer's K/V pools


class MLP(nn.Module):
    """SwiGLU's parts: the fused gate/up projection and the down projection."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)


@dataclass(slots=True)
class _Bound:
    """A layer's step arguments, looked up once (see keel.layers.generation)."""

    generation: int
    norm: torch.Tensor
    eps: float
    qkv: Projection
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    rope: RotaryEmbedding  # its table is read at each step (built after loading)
    heads: int
    kv_heads: int
    attn: PagedAttention  # its pools are read at each step (the runner grows them)
    o: Projection
    post_norm: torch.Tensor
    post_eps: float
    gate_up: Projection
    down: Projection


class DecoderLayer(nn.Module):
    """Pre-norm block; the residual stream travels beside the hidden state (vLLM pattern). Its step is two fused ops
    around the attention (keel.ops.layer): one definition for prompts, chunks, decode steps and batches."""

    def __init__(self, cfg: ModelConfig, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, rotary_emb)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self._bound: _Bound | None = None

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor | None, residual: torch.Tensor, ctx: AttnMetadata
    ) -> torch.Tensor:
        """x [T, H]: the previous layer's output (None in the first layer, whose residual is the embedding);
        residual [T, H] is updated in place. Returns this layer's output."""
        b = self._bound
        if b is None or b.generation != generation.current():
            b = self._bind()
        attn = b.attn
        q = ops.layer_qkv(x, residual, b.norm, b.eps, b.qkv, b.q_norm, b.k_norm, positions, b.rope.cos_sin_cache,
                          b.heads, b.kv_heads, attn.k_cache, attn.v_cache, ctx.slot_mapping)  # fmt: skip
        out = attn.forward(q, ctx)  # [T, heads, D]
        return ops.layer_mlp(out.view(out.shape[0], -1), residual, b.o, b.post_norm, b.post_eps, b.gate_up, b.down)

    def _bind(self) -> _Bound:
        a, mlp = self.self_attn, self.mlp
        norm, post = self.input_layernorm, self.post_attention_layernorm
        assert isinstance(a, Attention) and isinstance(mlp, MLP)
        assert isinstance(norm, RMSNorm) and isinstance(post, RMSNorm)
        q_norm = a.q_norm.weight if a.qk_norm else None
        k_norm = a.k_norm.weight if a.qk_norm else None
        self._bound = _Bound(
            generation=generation.current(), norm=norm.weight, eps=norm.eps, qkv=projection(a.qkv_proj),
            q_norm=q_norm, k_norm=k_norm, rope=a.rotary_emb, heads=a.num_heads, kv_heads=a.num_kv_heads, attn=a.attn,
            o=projection(a.o_proj), post_norm=post.weight, post_eps=post.eps, gate_up=projection(mlp.gate_up_proj),
            down=projection(mlp.down_proj),
        )  # fmt: skip
        return self._bound

    def _apply(self, *args: Any, **kwargs: Any) -> Any:
        generation.bump()  # parameters may be replaced, not registered: bind them again
        return super()._apply(*args, **kwargs)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary_emb = RotaryEmbedding(cfg.rope, cfg.head_dim, cfg.max_position_embeddings)
        self.layers = nn.ModuleList(DecoderLayer(cfg, self.rotary_emb) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttnMetadata) -> torch.Tensor:
        residual = self.embed_tokens(input_ids)  # [T, H]
        x = None
        for layer in self.layers:
            x = layer(positions, x, residual, ctx)
        if x is None:
            return self.norm(residual)
        hidden, _ = self.norm(x, residual)
        return hidden


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
