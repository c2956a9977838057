"""Llama-family decoder (Llama, SmolLM2, Qwen2, Qwen3, Mistral) over keel's ops and a paged KV cache."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import cast

import torch
from torch import nn

from keel import ops
from keel.engine.attention import AttnMetadata, paged_attention
from keel.hf.config import ModelConfig, RopeConfig
from keel.hf.weights import WeightsError


def rope_cos_sin_cache(
    rope: RopeConfig, head_dim: int, max_pos: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """[max_pos, head_dim] = cat(cos, sin), each head_dim/2 wide; llama3 scaling as in transformers."""
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.rope_type == "llama3":
        old_len = rope.original_max_position_embeddings
        low_wavelen = old_len / rope.low_freq_factor
        high_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)  # [P, D/2]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device=device, dtype=dtype)


class RMSNorm(nn.Module):
    """RMSNorm; with a residual it does the fused `residual += x; x = norm(residual)` in place."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps)
        ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
        return x, residual


class Attention(nn.Module):
    """GQA attention: fused qkv projection, rotary (keel ops), then the engine's paged attention seam."""

    def __init__(self, cfg: ModelConfig) -> None:
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
        self.sliding_window = cfg.sliding_window
        self.k_cache = torch.empty(0)  # [num_blocks, block_size, kv_heads, head_dim], set by the runner
        self.v_cache = torch.empty(0)
        self.cos_sin_cache = torch.empty(0)  # [max_pos, head_dim], shared, set after loading

    def forward(self, positions: torch.Tensor, x: torch.Tensor, ctx: AttnMetadata) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)  # [T, (H + 2 KV) * D]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:
            q = self.q_norm(q.view(t, self.num_heads, self.head_dim)).view(t, self.q_size)
            k = self.k_norm(k.view(t, self.num_kv_heads, self.head_dim)).view(t, self.kv_size)
        ops.rotary_embedding(positions, q, k, self.head_dim, self.cos_sin_cache, True)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        q = q.view(t, self.num_heads, self.head_dim)
        out = paged_attention(q, k, v, self.k_cache, self.v_cache, ctx, window=self.sliding_window)  # [T, H, D]
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

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
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
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttnMetadata) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)  # [T, H]
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, ctx)
        hidden, _ = self.norm(hidden, residual)
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

    def attention_layers(self) -> list[Attention]:
        """Every layer's attention module (each holds its layer's K/V pools and the rope cache)."""
        return [cast(DecoderLayer, layer).self_attn for layer in self.model.layers]

    def init_rope(self) -> None:
        """Build the shared cos/sin cache on the model's device and dtype (after loading)."""
        cfg, w = self.config, self.model.embed_tokens.weight
        cache = rope_cos_sin_cache(cfg.rope, cfg.head_dim, cfg.max_position_embeddings, w.dtype, w.device)
        for attn in self.attention_layers():
            attn.cos_sin_cache = cache

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
