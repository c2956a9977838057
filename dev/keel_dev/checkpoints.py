"""Test checkpoints, made offline (no network):

- tiny random checkpoints of each architecture (transformers, seeded) and a byte-level BPE tokenizer
  trained on a few sentences (`train_tokenizer`, `build_checkpoint`, `model_dir`);
- a random-weight Llama-family checkpoint written with safetensors and tokenizers only, for places
  without transformers (the GPU machine): `write_random_llama`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

ARCHS = ("llama", "llama3", "smollm2", "qwen2", "qwen3", "mistral")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "keel builds one wheel that survives torch upgrades without a rebuild.",
    "Hello world! Numbers 0123456789 and unicode: café, naïve, 東京.",
    "def f(x):\n    return x * 2 + 1\n",
] * 20
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def train_tokenizer(folder: Path) -> None:
    """A byte-level BPE with chat special tokens, trained on a few sentences, plus its HF side files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    bos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
    )
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|endoftext|>",
                "eos_token": "<|im_end|>",
                "chat_template": CHAT_TEMPLATE,
            }
        )
    )


def make_config(arch: str, vocab: int):  # -> transformers.PretrainedConfig
    import transformers as tf

    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.2,
        rms_norm_eps=1e-6,
        bos_token_id=0,
        eos_token_id=2,
    )
    if arch == "llama":
        return tf.LlamaConfig(**common, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if arch == "llama3":
        return tf.LlamaConfig(
            **common,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        )
    if arch == "smollm2":
        return tf.LlamaConfig(
            **{**common, "num_key_value_heads": 1},
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        )
    if arch == "qwen2":
        return tf.Qwen2Config(**common, tie_word_embeddings=True)
    if arch == "qwen3":
        return tf.Qwen3Config(**common, head_dim=32)
    if arch == "mistral":
        return tf.MistralConfig(**common, sliding_window=8)
    raise ValueError(arch)


def build_checkpoint(folder: Path, arch: str, tok_dir: Path, **save_kwargs) -> None:
    """Random-init `arch` with transformers (seeded) and save it with the tokenizer files."""
    import shutil

    import transformers as tf
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tok_dir / "tokenizer.json")).get_vocab_size()
    torch.manual_seed(ARCHS.index(arch))
    model = tf.AutoModelForCausalLM.from_config(make_config(arch, vocab), dtype=torch.float32)
    model.save_pretrained(folder, **save_kwargs)
    for f in tok_dir.iterdir():
        shutil.copy(f, folder / f.name)


# The Hermes / Qwen2.5 shape of a chat template with tools: the tools in a system block, the assistant's calls as
# <tool_call> JSON, tool results as <tool_response> in a user turn (what `--tool-call-parser auto` reads as hermes).
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\nFor each function call, return "
    "a json object within <tool_call></tool_call> XML tags.<|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}"
    "{%- elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content or '' }}"
    '{% for c in m.tool_calls %}<tool_call>\n{"name": "{{ c.function.name }}", "arguments": '
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def with_tools_template(folder: Path, dest: Path, context: int = 1024) -> Path:
    """A copy of the tiny checkpoint in `folder` whose chat template renders tools and tool calls (`TOOLS_TEMPLATE`)
    and whose context has room for tool specs (the tiny tokenizer spells JSON nearly a byte a token)."""
    import shutil

    shutil.copytree(folder, dest)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, "max_position_embeddings": context}))
    tok = json.loads((dest / "tokenizer_config.json").read_text())
    (dest / "tokenizer_config.json").write_text(json.dumps({**tok, "chat_template": TOOLS_TEMPLATE}))
    return dest


def model_dir(cache: Path, arch: str) -> Path:
    return cache / f"models--keel-test--tiny-{arch}" / "snapshots" / COMMIT


# A random-weight Llama-family checkpoint written with safetensors and tokenizers only (no transformers), for
# tests that must run where transformers is absent (the GPU machine: tests/*/test_cuda*.py).
#
# The layers get small weights (std 0.02, as Hugging Face initialises) so the residual stream stays tame; the
# untied lm_head gets large ones, so the logits spread widely and greedy decoding rarely meets a near-tie.
# The tokenizer is a word-level vocabulary `t0 .. t{V-1}`; prompts are token ids.
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


def write_random_llama(folder: Path, seed: int = 0, head_std: float = 2.0, tied: bool = False, **shape: int) -> Path:
    """config.json + model.safetensors (bf16) + tokenizer.json in `folder`; `shape` overrides SMOLLM2's.
    `tied`: no lm_head tensor, the embeddings serve as the head (SmolLM2's own layout)."""
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
    if not tied:
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
        "tie_word_embeddings": tied,
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
