"""Tiny random checkpoints of each architecture and a tokenizer trained offline (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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


@pytest.fixture(scope="session")
def keel_native_ops():
    """keel's native ops, loaded. The suite always runs against the installed wheel, so a missing or
    broken keel/_C.abi3.so FAILS every test that needs the ops (with the loader's message), never skips."""
    try:
        from keel import ops
    except Exception as exc:  # noqa: BLE001 - whatever the loader raised is the failure to report
        pytest.fail(f"keel's native ops did not load: {type(exc).__name__}: {exc}", pytrace=False)
    if not hasattr(ops, "rms_norm"):
        pytest.fail(f"keel.ops ({ops.__file__}) has no rms_norm: not keel's op package", pytrace=False)
    return ops


# for tests that need keel's native ops; the conftests that use it import keel_native_ops too
needs_ops = pytest.mark.usefixtures("keel_native_ops")


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


def model_dir(cache: Path, arch: str) -> Path:
    return cache / f"models--keel-test--tiny-{arch}" / "snapshots" / COMMIT
