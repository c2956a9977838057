"""Convert a llama GGUF into a Hugging Face checkpoint folder (safetensors, configs, tokenizer)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .quants import dequantize
from .reader import GGUFError, GGUFFile, read_gguf
from .tokenizer import ConvertedTokenizer, build_tokenizer

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

# llama.cpp names (gguf-py TensorNameMap) -> Hugging Face Llama names
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")


@dataclass(frozen=True, slots=True)
class LlamaShape:
    """The hyper-parameters a llama GGUF states, checked for consistency."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    context_length: int
    rope_theta: float
    rms_norm_eps: float

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
        ):
            if getattr(self, name) <= 0:
                raise GGUFError(f"llama.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise GGUFError(f"head_count {self.num_heads} must be a multiple of head_count_kv {self.num_kv_heads}")
        if self.head_dim % 2:
            raise GGUFError(f"head dim {self.head_dim} must be even for rotary embeddings")


def hf_name(gguf_name: str) -> str:
    """The Hugging Face Llama name of a llama.cpp tensor name; GGUFError for names keel does not know."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.weight"
    raise GGUFError(f"tensor {gguf_name!r} is not part of a llama model that keel can convert")


def permute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's rope permutation of q/k rows (convert_hf_to_gguf ``permute``): HF -> GGUF layout."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo :func:`permute_qk`: GGUF interleaved rope pairs -> HF rotate-half halves."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_shape(gguf: GGUFFile) -> LlamaShape:
    """Read and check the ``llama.*`` hyper-parameters."""
    arch = gguf.require("general.architecture")
    if arch != "llama":
        raise GGUFError(f"{gguf.path}: general.architecture is {arch!r}; keel converts only 'llama'")
    if gguf.get("llama.rope.scaling.type", "none") not in ("none", None):
        raise GGUFError(f"{gguf.path}: rope scaling {gguf.get('llama.rope.scaling.type')!r} is not supported")
    hidden = int(gguf.require("llama.embedding_length"))
    heads = int(gguf.require("llama.attention.head_count"))
    head_dim = int(gguf.get("llama.attention.key_length", hidden // max(heads, 1)))
    rope_dims = gguf.get("llama.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise GGUFError(f"{gguf.path}: llama.rope.dimension_count is {rope_dims}, expected the head dim {head_dim}")
    vocab = gguf.get("llama.vocab_size") or len(gguf.get("tokenizer.ggml.tokens") or ())
    if not vocab:
        vocab = gguf.tensor("token_embd.weight").shape[0]
    return LlamaShape(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(gguf.require("llama.feed_forward_length")),
        num_layers=int(gguf.require("llama.block_count")),
        num_heads=heads,
        num_kv_heads=int(gguf.get("llama.attention.head_count_kv", heads)),
        head_dim=head_dim,
        context_length=int(gguf.require("llama.context_length")),
        rope_theta=float(gguf.get("llama.rope.freq_base", 10000.0)),
        rms_norm_eps=float(gguf.require("llama.attention.layer_norm_rms_epsilon")),
    )


def expected_shapes(s: LlamaShape) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name of the model (without lm_head) and its torch shape."""
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    out = {"model.embed_tokens.weight": (s.vocab_size, s.hidden_size), "model.norm.weight": (s.hidden_size,)}
    for i in range(s.num_layers):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": (q, s.hidden_size),
            p + "self_attn.k_proj.weight": (kv, s.hidden_size),
            p + "self_attn.v_proj.weight": (kv, s.hidden_size),
            p + "self_attn.o_proj.weight": (s.hidden_size, q),
            p + "mlp.gate_proj.weight": (s.intermediate_size, s.hidden_size),
            p + "mlp.up_proj.weight": (s.intermediate_size, s.hidden_size),
            p + "mlp.down_proj.weight": (s.hidden_size, s.intermediate_size),
            p + "input_layernorm.weight": (s.hidden_size,),
            p + "post_attention_layernorm.weight": (s.hidden_size,),
        }
    return out


def convert_state_dict(gguf: GGUFFile, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Dequantize every tensor, rename it to HF Llama and undo the q/k rope permutation."""
    shape = llama_shape(gguf)
    expected = expected_shapes(shape)
    state: dict[str, torch.Tensor] = {}
    for name, info in gguf.tensors.items():
        target = hf_name(name)
        want = (shape.vocab_size, shape.hidden_size) if target == "lm_head.weight" else expected.get(target)
        if want is None:
            raise GGUFError(f"{gguf.path}: tensor {name!r} ({target!r}) is not in a {shape.num_layers}-layer model")
        if info.shape != want:
            raise GGUFError(f"{gguf.path}: tensor {name!r} has shape {info.shape}, expected {want} from the metadata")
        try:
            values = dequantize(gguf.raw(name), info.ggml_type, info.shape)
        except ValueError as exc:
            raise GGUFError(f"{gguf.path}: tensor {name!r}: {exc}") from None
        if not np.isfinite(values).all():
            raise GGUFError(f"{gguf.path}: tensor {name!r} holds NaN or infinite values; the file is corrupt")
        w = torch.from_numpy(values)
        if target.endswith("q_proj.weight"):
            w = unpermute_qk(w, shape.num_heads)
        elif target.endswith("k_proj.weight"):
            w = unpermute_qk(w, shape.num_kv_heads)
        state[target] = w.to(dtype).contiguous()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise GGUFError(f"{gguf.path}: {len(missing)} tensors are missing, e.g. {missing[:3]}")
    return state


def hf_config(gguf: GGUFFile, tok: ConvertedTokenizer, tied: bool, dtype: str) -> dict[str, Any]:
    """``config.json`` for ``LlamaForCausalLM`` from the GGUF metadata."""
    s = llama_shape(gguf)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": s.vocab_size,
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "num_hidden_layers": s.num_layers,
        "num_attention_heads": s.num_heads,
        "num_key_value_heads": s.num_kv_heads,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": s.context_length,
        "rms_norm_eps": s.rms_norm_eps,
        "rope_theta": s.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        "torch_dtype": dtype,
        "use_cache": True,
    }


def write_checkpoint(gguf_path: str | os.PathLike[str], out_dir: Path, dtype: str = "bfloat16") -> list[str]:
    """Convert ``gguf_path`` into files in the existing folder ``out_dir``; returns the file names.

    Everything is computed and validated in memory before the first file is written.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    from safetensors.torch import save_file

    with read_gguf(gguf_path) as gguf:
        state = convert_state_dict(gguf, DTYPES[dtype])
        tied = "lm_head.weight" not in state
        tok = build_tokenizer(gguf, max_length=llama_shape(gguf).context_length)
        config = hf_config(gguf, tok, tied, dtype)
    generation = {
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    files: dict[str, Any] = {
        "config.json": config,
        "generation_config.json": {k: v for k, v in generation.items() if v is not None},
        "tokenizer_config.json": tok.config,
        "special_tokens_map.json": tok.special_tokens_map,
    }
    for name, payload in files.items():
        (out_dir / name).write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tok.tokenizer.save(str(out_dir / "tokenizer.json"))
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt", "converted_by": "keel.gguf"})
    return sorted([*files, "tokenizer.json", "model.safetensors"])
