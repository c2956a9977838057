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

from ..hf.config import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_INTERMEDIATE,
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_THETA,
    MAX_VOCAB,
    ConfigError,
    ModelConfig,
)
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
    """The hyper-parameters a llama GGUF states (checked by `llama_shape`)."""

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


def hf_name(gguf_name: str, path: str | os.PathLike[str] = "GGUF") -> str:
    """The Hugging Face Llama name of a llama.cpp tensor name; GGUFError for names keel does not know."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.weight"
    raise GGUFError(f"{path}: tensor {gguf_name!r} is not part of a llama model that keel can convert")


def permute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's rope permutation of q/k rows (convert_hf_to_gguf ``permute``): HF -> GGUF layout."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo :func:`permute_qk`: GGUF interleaved rope pairs -> HF rotate-half halves."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_shape(gguf: GGUFFile) -> LlamaShape:
    """Read and check the ``llama.*`` hyper-parameters: typed, within keel.hf.config's bounds, consistent."""
    p = gguf.path
    arch = gguf.get_str("general.architecture")
    if arch != "llama":
        raise GGUFError(f"{p}: general.architecture is {arch!r}; keel converts only 'llama'")
    scaling = gguf.get_str("llama.rope.scaling.type", "none")
    if scaling != "none":
        raise GGUFError(f"{p}: llama.rope.scaling.type {scaling!r} is not supported (only 'none')")
    hidden = gguf.get_int("llama.embedding_length", 1, MAX_HIDDEN)
    heads = gguf.get_int("llama.attention.head_count", 1, MAX_HEADS)
    kv_heads = gguf.get_int("llama.attention.head_count_kv", 1, MAX_HEADS, default=heads)
    if heads % kv_heads:
        raise GGUFError(f"{p}: llama.attention.head_count_kv must divide head_count ({heads}), got {kv_heads}")
    if "llama.attention.key_length" not in gguf.metadata and hidden % heads:
        raise GGUFError(f"{p}: llama.attention.head_count must divide llama.embedding_length ({hidden}), got {heads}")
    head_dim = gguf.get_int("llama.attention.key_length", 2, MAX_HEAD_DIM, default=hidden // heads)
    if head_dim % 2:
        raise GGUFError(
            f"{p}: the head dim (llama.attention.key_length, or embedding_length / head_count) must be even, "
            f"got {head_dim}"
        )
    rope_dims = gguf.get_int("llama.rope.dimension_count", 1, MAX_HEAD_DIM, default=head_dim)
    if rope_dims != head_dim:
        raise GGUFError(
            f"{p}: llama.rope.dimension_count is {rope_dims}, expected the head dim {head_dim} "
            "(llama.attention.key_length, or llama.embedding_length / llama.attention.head_count)"
        )
    tokens = gguf.get_list("tokenizer.ggml.tokens", str, default=[])
    vocab = gguf.get_int("llama.vocab_size", 1, MAX_VOCAB, default=len(tokens) or None)
    if vocab is None:
        vocab = gguf.tensor("token_embd.weight").shape[0]
    if tokens and len(tokens) > vocab:
        raise GGUFError(f"{p}: tokenizer.ggml.tokens has {len(tokens)} entries, more than llama.vocab_size {vocab}")
    return LlamaShape(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=gguf.get_int("llama.feed_forward_length", 1, MAX_INTERMEDIATE),
        num_layers=gguf.get_int("llama.block_count", 1, MAX_LAYERS),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        context_length=gguf.get_int("llama.context_length", 1, MAX_POSITIONS),
        rope_theta=gguf.get_float("llama.rope.freq_base", 0, MAX_THETA, default=10000.0),
        rms_norm_eps=gguf.get_float("llama.attention.layer_norm_rms_epsilon", 0, 0.999),
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


def _implied_by(hf: str) -> str:
    """The metadata keys behind the expected shape of HF tensor `hf`."""
    if "embed_tokens" in hf or "lm_head" in hf:
        return "llama.vocab_size, llama.embedding_length"
    if "q_proj" in hf or "o_proj" in hf:
        return "llama.attention.head_count, the head dim, llama.embedding_length"
    if "k_proj" in hf or "v_proj" in hf:
        return "llama.attention.head_count_kv, the head dim, llama.embedding_length"
    if ".mlp." in hf:
        return "llama.feed_forward_length, llama.embedding_length"
    return "llama.embedding_length"


def convert_state_dict(gguf: GGUFFile, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Dequantize every tensor, rename it to HF Llama and undo the q/k rope permutation."""
    shape = llama_shape(gguf)
    expected = expected_shapes(shape)
    state: dict[str, torch.Tensor] = {}
    for name, info in gguf.tensors.items():
        target = hf_name(name, gguf.path)
        want = (shape.vocab_size, shape.hidden_size) if target == "lm_head.weight" else expected.get(target)
        if want is None:
            raise GGUFError(
                f"{gguf.path}: tensor {name!r} ({target!r}) is not in a {shape.num_layers}-layer model "
                "(llama.block_count)"
            )
        if info.shape != want:
            raise GGUFError(
                f"{gguf.path}: tensor {name!r} has shape {info.shape}, expected {want} from the metadata "
                f"({_implied_by(target)})"
            )
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
        raise GGUFError(
            f"{gguf.path}: {len(missing)} tensors that the metadata implies are missing "
            f"(llama.block_count={shape.num_layers}), e.g. {missing[:3]}"
        )
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
    try:  # what keel writes, keel must load: the same checks the loader applies, before a file is written
        ModelConfig.from_dict(config)
    except ConfigError as exc:
        raise GGUFError(f"{gguf_path}: its metadata gives a config keel cannot load: {exc}") from None
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
