"""Fixtures: a tokenizer trained offline and tiny random checkpoints of each architecture in an HF cache."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

ARCHS = ("llama", "llama3", "smollm2", "qwen2", "qwen3", "mistral")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "keel builds one wheel that survives torch upgrades without a rebuild.",
    "Hello world! Numbers 0123456789 and unicode: café, naïve, 東京.",
    "def f(x):\n    return x * 2 + 1\n",
] * 20
_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _ops_available() -> bool:
    try:
        from keel import ops

        return hasattr(ops, "rms_norm")
    except Exception:  # native library missing or broken
        return False


def _install_reference_ops() -> None:
    """Only with KEEL_TEST_REFERENCE_OPS=1: stand in plain-torch ops while the native build is absent."""
    sys.path.insert(0, str(Path(__file__).parent))
    import types

    import reference_ops

    import keel

    module = types.ModuleType("keel.ops")
    for name in ("rms_norm", "fused_add_rms_norm", "rotary_embedding", "silu_and_mul", "fused_muladd"):
        setattr(module, name, getattr(reference_ops, name))
    sys.modules["keel.ops"] = module
    keel.ops = module  # type: ignore[attr-defined]


HAVE_OPS = _ops_available()
if not HAVE_OPS and os.environ.get("KEEL_TEST_REFERENCE_OPS") == "1":
    _install_reference_ops()
    HAVE_OPS = True
needs_ops = pytest.mark.skipif(not HAVE_OPS, reason="keel's native ops (keel/_C.abi3.so) are not built")


def train_tokenizer(folder: Path) -> None:
    """A byte-level BPE with chat special tokens, trained on a few sentences, plus its HF side files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    bos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[
        ("<|endoftext|>", bos)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
        "chat_template": CHAT_TEMPLATE}))


def make_config(arch: str, vocab: int):  # -> transformers.PretrainedConfig
    import transformers as tf

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  initializer_range=0.2, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=2)
    if arch == "llama":
        return tf.LlamaConfig(**common, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if arch == "llama3":
        return tf.LlamaConfig(**common, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    if arch == "smollm2":
        return tf.LlamaConfig(**{**common, "num_key_value_heads": 1}, tie_word_embeddings=True,
                              rope_parameters={"rope_type": "default", "rope_theta": 100000.0})
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


@pytest.fixture(scope="session")
def hf_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An HF hub cache holding `keel-test/tiny-<arch>` for every arch; the env points at it, offline."""
    root = tmp_path_factory.mktemp("hf_home")
    tok_dir = root / "tokenizer"
    tok_dir.mkdir()
    train_tokenizer(tok_dir)
    cache = root / "hub"
    for arch in ARCHS:
        repo = cache / f"models--keel-test--tiny-{arch}"
        build_checkpoint(repo / "snapshots" / _COMMIT, arch, tok_dir)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(_COMMIT)
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_CACHE", str(cache))
    mp.setenv("HF_HUB_OFFLINE", "1")
    yield cache
    mp.undo()


def model_dir(cache: Path, arch: str) -> Path:
    return cache / f"models--keel-test--tiny-{arch}" / "snapshots" / _COMMIT


@pytest.fixture(scope="session")
def llms(hf_cache: Path):
    """One fp32 `keel.LLM` per arch, loaded lazily and shared across tests."""
    from keel.engine import LLM

    loaded: dict[str, LLM] = {}

    def get(arch: str) -> LLM:
        if arch not in loaded:
            loaded[arch] = LLM(f"keel-test/tiny-{arch}", dtype="float32", device="cpu", block_size=4)
        return loaded[arch]

    return get


@pytest.fixture(scope="session")
def hf_models(hf_cache: Path):
    """The transformers twin of each checkpoint (fp32, eager attention) for reference outputs."""
    import transformers as tf

    loaded: dict[str, torch.nn.Module] = {}

    def get(arch: str) -> torch.nn.Module:
        if arch not in loaded:
            loaded[arch] = tf.AutoModelForCausalLM.from_pretrained(
                model_dir(hf_cache, arch), dtype=torch.float32, attn_implementation="eager").eval()
        return loaded[arch]

    return get
