"""The tensors a Llama-family Hugging Face checkpoint holds, by name and shape, derived from its config.

keel's loader (src/keel/models/llama.py `load_weights`) accepts exactly these (q/k/v and gate/up are fused
there) and skips only rotary `inv_freq` buffers and a tied `lm_head.weight`; tests/hf checks the two
agree for every architecture. `keel.hf.weights.validate_checkpoint` compares a checkpoint's headers
with them before the model is built.
"""

from __future__ import annotations

from .config import ModelConfig

FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")  # what keel copies into its parameters

Shape = tuple[int, ...]


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[Shape, str]]:
    """Every tensor name of the Hugging Face checkpoint `cfg` describes -> (shape, the config fields behind it)."""
    h, v, i, d = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.q_size, cfg.kv_size
    hv = f"vocab_size={v}, hidden_size={h}"
    qf = f"num_attention_heads={cfg.num_attention_heads}, head_dim={d}, hidden_size={h}"
    kvf = f"num_key_value_heads={cfg.num_key_value_heads}, head_dim={d}, hidden_size={h}"
    mf = f"intermediate_size={i}, hidden_size={h}"
    out: dict[str, tuple[Shape, str]] = {
        "model.embed_tokens.weight": ((v, h), hv),
        "model.norm.weight": ((h,), f"hidden_size={h}"),
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = ((v, h), f"{hv}, tie_word_embeddings=false")
    for n in range(cfg.num_hidden_layers):
        p, a, m = f"model.layers.{n}.", f"model.layers.{n}.self_attn.", f"model.layers.{n}.mlp."
        out |= {
            a + "q_proj.weight": ((q, h), qf),
            a + "k_proj.weight": ((kv, h), kvf),
            a + "v_proj.weight": ((kv, h), kvf),
            a + "o_proj.weight": ((h, q), qf),
            m + "gate_proj.weight": ((i, h), mf),
            m + "up_proj.weight": ((i, h), mf),
            m + "down_proj.weight": ((h, i), mf),
            p + "input_layernorm.weight": ((h,), f"hidden_size={h}"),
            p + "post_attention_layernorm.weight": ((h,), f"hidden_size={h}"),
        }
        if cfg.attention_bias:
            why = f"attention_bias (architectures {cfg.architecture})"
            out |= {a + "q_proj.bias": ((q,), why), a + "k_proj.bias": ((kv,), why), a + "v_proj.bias": ((kv,), why)}
        if cfg.mlp_bias:
            why = "mlp_bias=true"
            out |= {
                m + "gate_proj.bias": ((i,), why),
                m + "up_proj.bias": ((i,), why),
                m + "down_proj.bias": ((h,), why),
            }
        if cfg.qk_norm:
            why = f"architectures {cfg.architecture} (q/k norms), head_dim={d}"
            out |= {a + "q_norm.weight": ((d,), why), a + "k_norm.weight": ((d,), why)}
    return out


def skipped(name: str, cfg: ModelConfig) -> bool:
    """Tensors keel's loader skips: rotary inv_freq buffers, and lm_head when it is tied to the embedding."""
    return "rotary_emb.inv_freq" in name or (cfg.tie_word_embeddings and name == "lm_head.weight")


def why_unexpected(name: str, cfg: ModelConfig) -> str:
    parts = name.split(".")
    if (
        name.startswith("model.layers.")
        and len(parts) > 2
        and parts[2].isdigit()
        and int(parts[2]) >= cfg.num_hidden_layers
    ):
        return f"config.json has num_hidden_layers={cfg.num_hidden_layers}"
    if name.endswith("_proj.bias"):
        flag = "mlp_bias" if ".mlp." in name else "attention_bias"
        return f"config.json has {flag}=false, or keel's {cfg.architecture} has no such bias"
    if "q_norm" in name or "k_norm" in name:
        return f"architectures {cfg.architecture} in config.json has no q/k norms (Qwen3ForCausalLM does)"
    return f"keel's {cfg.architecture} has no such parameter"
