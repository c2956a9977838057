"""A random-weight Llama-family checkpoint written with safetensors and tokenizers only (no transformers), for
tests that must run where transformers is absent (the GPU machine: tests/*/test_cuda*.py).

The layers get small weights (std 0.02, as Hugging Face initialises) so the residual stream stays tame; the
untied lm_head gets large ones, so the logits spread widely and greedy decoding rarely meets a near-tie.
The tokenizer is a word-level vocabulary `t0 .. t{V-1}`; prompts are token ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# SmolLM2-135M's shapes (keel's default model); vocab and layers may be cut for speed
SMOLLM2 = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=2048,
)


def write_random_llama(folder: Path, seed: int = 0, head_std: float = 2.0, **shape: int) -> Path:
    """config.json + model.safetensors (bf16) + tokenizer.json in `folder`; `shape` overrides SMOLLM2's."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    cfg = {**SMOLLM2, **shape}
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * d

    def rand(*s: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*s, generator=g) * std).to(torch.bfloat16)

    w = {"model.embed_tokens.weight": rand(v, h, std=1.0), "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    w["lm_head.weight"] = rand(v, h, std=head_std)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w |= {
            p + "self_attn.q_proj.weight": rand(h, h),
            p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h),
            p + "self_attn.o_proj.weight": rand(h, h),
            p + "mlp.gate_proj.weight": rand(inter, h),
            p + "mlp.up_proj.weight": rand(inter, h),
            p + "mlp.down_proj.weight": rand(h, inter),
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        }
    save_file(w, str(folder / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **cfg,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 0,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(v)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "t0", "bos_token": "t0"}))
    return folder
